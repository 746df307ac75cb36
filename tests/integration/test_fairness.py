"""Fairness across limit keys (issue #20): due tasks of different keys are served in weighted
round-robin (self-clocked fair queueing in the fetch script), priority and due order kept
within a key, unkeyed tasks sharing one implicit key."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import redis

from delayq import Limit, Offer
from tests.helpers import wait_until


def hand_out_order(q, n: int, batch: int = 5, timeout: float = 20.0) -> list:
    """Every task's payload in the order fetched, acking as it goes."""
    order: list = []
    deadline = time.monotonic() + timeout
    while len(order) < n:
        assert time.monotonic() < deadline, f"only {len(order)} of {n} came"
        tasks = q.poll_many(batch, timeout=1)
        order += [t.payload for t in tasks]
        q.ack_many(tasks)
    return order


def test_a_small_key_is_not_stuck_behind_a_big_one(make_queue) -> None:
    q = make_queue("skew")
    q.offer_many([Offer(["big", i], 0, limit_key="big") for i in range(2_000)])
    q.offer_many([Offer(["small", i], 0, limit_key="small") for i in range(20)])
    order = hand_out_order(q, 2_020, batch=10)
    small_at = [i for i, (key, _) in enumerate(order) if key == "small"]
    # Served in turn from the first calls on: the 20th small task within ~2 x 20 hand-outs
    # (the big key's 2,000 were due first and, in due order, would all go before them).
    assert small_at[-1] < 60, small_at
    assert [n for key, n in order if key == "small"] == list(range(20))
    assert [n for key, n in order if key == "big"] == list(range(2_000))


def test_weights_share_the_hand_outs(make_queue) -> None:
    q = make_queue("weights")
    q.limits.set("heavy", Limit(weight=3))
    q.offer_many([Offer(["heavy", i], 0, limit_key="heavy") for i in range(400)])
    q.offer_many([Offer(["light", i], 0, limit_key="light") for i in range(400)])
    order = hand_out_order(q, 800, batch=8)
    first = Counter(key for key, _ in order[:200])
    assert 145 <= first["heavy"] <= 155, first  # 3:1 of the first 200 is 150:50


def test_priority_and_due_order_are_kept_within_a_key(make_queue) -> None:
    q = make_queue("prio")
    q.offer_many([Offer(["a", i], 0, limit_key="a", priority=i % 3) for i in range(30)])
    q.offer_many([Offer(["b", i], 0, limit_key="b") for i in range(30)])
    order = hand_out_order(q, 60, batch=4)
    a = [n for key, n in order if key == "a"]
    priorities = [n % 3 for n in a]
    assert priorities == sorted(priorities, reverse=True), priorities
    assert [n for key, n in order if key == "b"] == list(range(30))


def test_unkeyed_tasks_share_one_implicit_key(make_queue, client: redis.Redis) -> None:
    q = make_queue("unkeyed")
    q.offer_many([Offer(["a", i], 0, limit_key="a") for i in range(300)])
    q.offer_many([Offer(["none", i], 0) for i in range(10)])
    q.offer_many([Offer(["b", i], 0, limit_key="b") for i in range(10)])
    first = hand_out_order(q, 30, batch=3)
    assert Counter(key for key, _ in first) == {"a": 10, "none": 10, "b": 10}, first
    rest = hand_out_order(q, 290)
    assert len(rest) == 290
    leftovers = [k.decode() for k in client.keys(f"{q.keys.prefix}:*lim*")]
    assert leftovers == [], leftovers  # lines, tags and the virtual time go with the tasks


def test_a_task_waiting_in_line_can_be_read_and_cancelled(make_queue) -> None:
    q = make_queue("inline")
    q.limits.set("a", Limit(concurrency=1))
    q.offer_many([Offer(["a", i], 0, limit_key="a") for i in range(3)])
    loose = q.offer(["none", 0], 0)
    keyed = q.offer(["b", 0], 0, limit_key="b")
    got = q.poll_many(1, timeout=2)  # moves every due task into its key's line
    assert len(got) == 1
    for task_id in (loose, keyed):
        if task_id != got[0].id:
            assert q.get(task_id) is not None
            assert q.cancel(task_id)
            assert q.get(task_id) is None
    rest = hand_out_order(q, 2, batch=1) if got[0].payload[0] != "a" else None
    assert rest is None or all(key == "a" for key, _ in rest)


def test_a_big_key_at_concurrency_one_lets_every_other_key_through(make_queue) -> None:
    """The bar's shape, smaller: 3,000 tasks of one key at concurrency 1 ahead of 50 keys'
    tasks; the others are all handed out within a few calls, the big key one at a time."""
    q = make_queue("concfair")
    q.limits.set("big", Limit(concurrency=1))
    q.offer_many([Offer(["big", i], 0, limit_key="big") for i in range(3_000)])
    q.offer_many([Offer(["other", i], 0, limit_key=f"k{i}") for i in range(50)])
    others, calls, big_held = 0, 0, 0
    deadline = time.monotonic() + 20
    while others < 50:
        assert time.monotonic() < deadline, f"{others} of 50 others after {calls} calls"
        tasks = q.poll_many(10, timeout=1)
        calls += 1
        for t in tasks:
            if t.payload[0] == "other":
                others += 1
                t.ack()
            else:
                big_held += 1
        assert big_held <= 1, "the big key ran over its concurrency"
    assert calls <= 12, calls
    assert q.limits.get("big").waiting == 3_000 - big_held


def test_sharded_keyed_queue_drains_fairly(make_queue) -> None:
    q = make_queue("shfair", shards=3)
    q.offer_many([Offer(["big", i], 0, limit_key="big") for i in range(600)])
    q.offer_many([Offer(["small", i], 0, limit_key="small") for i in range(10)])
    order = hand_out_order(q, 610, batch=10)
    # The keys may live on different shards; either way the small key is not behind the big.
    assert [i for i, (k, _) in enumerate(order) if k == "small"][-1] < 200
    assert sorted(n for k, n in order if k == "big") == list(range(600))


async def test_async_fairness(make_async_queue) -> None:
    q = make_async_queue("afair")
    await q.offer_many([Offer(["big", i], 0, limit_key="big") for i in range(500)])
    await q.offer_many([Offer(["small", i], 0, limit_key="small") for i in range(5)])
    order: list = []
    while len(order) < 20:
        tasks = await q.poll_many(4, timeout=1)
        order += [t.payload[0] for t in tasks]
        await q.ack_many(tasks)
    assert order.count("small") == 5, order


def test_a_key_whose_limit_gate_opens_gets_its_turn(make_queue) -> None:
    """A rate-gated key rejoins the line when its gate opens, and is not starved by a
    backlogged key meanwhile."""
    q = make_queue("gated")
    q.limits.set("slow", Limit(rate=5, burst=1))
    q.offer_many([Offer(["slow", i], 0, limit_key="slow") for i in range(3)])
    q.offer_many([Offer(["busy", i], 0, limit_key="busy") for i in range(2_000)])
    slow_at: list[float] = []
    deadline = time.monotonic() + 15

    def step() -> bool:
        for t in q.poll_many(20, timeout=0.5):
            if t.payload[0] == "slow":
                slow_at.append(time.monotonic())
            t.ack()
        return len(slow_at) == 3 or time.monotonic() > deadline

    wait_until(step, timeout=20)
    assert len(slow_at) == 3
    gaps = [b - a for a, b in itertools.pairwise(slow_at)]
    assert all(0.15 <= g < 1.0 for g in gaps), gaps  # 5/s: 200 ms apart, never much later


def test_tasks_waiting_in_line_are_listed_as_ready_and_can_be_rescheduled(make_queue) -> None:
    q = make_queue("listed")
    q.limits.set("t", Limit(concurrency=1))
    ids = q.offer_many([Offer(["t", i], 0, limit_key="t") for i in range(3)])
    loose = q.offer(["none", 0], 0)
    first = q.poll(timeout=2)  # moves every due task into its key's line
    assert first is not None
    ready = {row.id for row in q.tasks("ready", limit=10)}
    assert ready == {*ids, loose} - {first.id}, ready
    assert [row.id for row in q.tasks("ready", offset=1, limit=10)] != []
    assert len(q.tasks("ready", offset=0, limit=1)) == 1
    waiting = sorted(ready - {loose})
    assert q.reschedule(waiting[0], 3600)  # out of its line, due in an hour
    assert q.get(waiting[0]).state == "delayed"
    assert q.limits.get("t").waiting == 1
    first.ack()
    got = q.poll_many(10, timeout=2)
    assert waiting[0] not in {t.id for t in got}


def test_purging_ready_tasks_takes_those_waiting_in_line(make_queue, client: redis.Redis) -> None:
    q = make_queue("purgeline")
    q.limits.set("t", Limit(concurrency=1))
    q.offer_many([Offer(["t", i], 0, limit_key="t") for i in range(5)])
    q.offer_many([Offer(["none", i], 0) for i in range(3)])
    held = q.poll(timeout=2)  # the rest move into their keys' lines
    assert held is not None
    assert q.purge("ready") == 7
    assert q.stats().ready == 0 and q.limits.get("t").waiting == 0
    held.ack()
    assert q.poll(timeout=0.2) is None
    assert client.keys(f"{q.keys.prefix}:*lim:w:*") == []


def test_tasks_waiting_their_turn_count_as_overdue(make_queue) -> None:
    """Moved into their keys' lines, due tasks still count as overdue (the alerts read it),
    unless a limit holds them back."""
    q = make_queue("overdue", overdue_after=0.05)
    q.limits.set("held", Limit(concurrency=1))
    past = time.time() - 5
    q.offer_many([Offer(["a", i], at=past, limit_key="a") for i in range(30)])
    q.offer_many([Offer(["held", i], at=past, limit_key="held") for i in range(4)])
    # Every due task moves into its key's line; "held" takes its turn once, and at its next
    # turn, at its cap, leaves the line (held back by its limit, not overdue).
    first = q.poll_many(4, timeout=2)
    assert [t.payload[0] for t in first] == ["a", "held", "a", "a"]
    stats = q.stats()
    assert stats.overdue == 27, stats
    assert stats.oldest_overdue_age >= 4.5
