"""Limits (issue #20): concurrency per key counted by leases, GCRA rates on the server's clock,
over-limit tasks parked in order until their exact time, never retried or counted."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta

import pytest
import redis

from delayq import ConfigError, InvalidTaskError, Limit, LimitInfo, Offer, TaskState, Worker
from delayq._core import protocol
from delayq._core.scripts import Op
from delayq._core.sharding import shard_of
from tests.helpers import wait_until


def keyed(n: int, key: str, start: int = 0) -> list[Offer]:
    return [Offer(start + i, 0, limit_key=key) for i in range(n)]


def drain(q, n: int, timeout: float = 10.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} came"
        got += q.poll_many(50, timeout=1)
    return got


def test_concurrency_per_key_counts_leases_and_parks_in_order(make_queue) -> None:
    q = make_queue("c")
    q.limits.set("t", Limit(concurrency=2))
    q.offer_many(keyed(6, "t"))
    q.offer("free", 0)  # a task without a key is not held back by the key's limit
    first = q.poll_many(10, timeout=2)
    assert sorted(t.payload for t in first if t.payload != "free") == [0, 1]
    assert "free" in [t.payload for t in first]
    assert q.poll_many(10, timeout=0.3) == []
    info = q.limits.get("t")
    assert (info.running, info.waiting) == (2, 4)
    assert info.limit == Limit(concurrency=2) and info.limit_of == "t"
    order = []
    for task in first:
        task.ack()
    while len(order) < 4:
        batch = q.poll_many(10, timeout=2)
        assert batch and len(batch) <= 2, batch
        order += [t.payload for t in batch]
        assert all(t.attempts == 1 for t in batch), "waiting on a limit counted as an attempt"
        for task in batch:
            task.ack()
    assert order == [2, 3, 4, 5], "the key's tasks came out of order"
    assert q.limits.get("t").running == 0 and q.stats().total == 0


@pytest.mark.parametrize("end", ["ack", "nack", "retry", "release", "reject", "expiry"])
def test_each_way_a_lease_ends_frees_exactly_one_slot(make_queue, end: str) -> None:
    q = make_queue(f"e{end}", visibility_timeout=0.5 if end == "expiry" else 30)
    q.limits.set("t", Limit(concurrency=2))
    q.offer_many(keyed(5, "t"))
    held = q.poll_many(10, timeout=2)
    assert len(held) == 2
    task = held[0]
    if end == "ack":
        task.ack()
    elif end == "nack":
        task.nack(60)
    elif end == "retry":
        task.retry(60, error="boom")
    elif end == "release":
        task.release()
    elif end == "reject":
        task.reject("bad")
    else:  # its lease runs out (the other's too: extend that one)
        held[1].extend(30)
    got = drain(q, 1, timeout=5)
    assert len(got) == 1, got
    assert q.poll_many(10, timeout=0.3) == [], "one freed slot let more than one task in"
    info, stats = q.limits.get("t"), q.stats()
    assert info.running == 2
    coming_back = end in ("nack", "retry", "release", "expiry")  # ack, reject: it is done
    assert stats.delayed + stats.ready == 2 + coming_back  # ready counts the parked ones
    assert info.waiting <= stats.ready


def test_a_lost_ack_reply_does_not_free_a_slot_twice(make_queue) -> None:
    q = make_queue("lost")
    q.limits.set("t", Limit(concurrency=1))
    q.offer_many(keyed(3, "t"))
    task = q.poll(timeout=2)
    assert task is not None
    shard = q._all()[0]
    calls = shard.ack_calls([task])
    for _ in range(2):
        for keys, args in calls:
            assert protocol.parse_ack(shard.run(Op.ACK, args, keys=keys)) == [True]
    assert q.limits.get("t").running == 0
    second = q.poll(timeout=2)
    assert second is not None and second.payload == 1
    assert q.poll(timeout=0.3) is None, "a resent ack freed a second slot"
    assert q.limits.get("t").running == 1


def test_a_freed_slot_wakes_a_sleeping_consumer(make_queue) -> None:
    producer = make_queue("wake")
    consumer = make_queue("wake", safety_interval=30)
    producer.limits.set("t", Limit(concurrency=1))
    producer.offer_many(keyed(2, "t"))
    first = consumer.poll(timeout=2)
    assert first is not None and consumer.poll(timeout=0.2) is None
    got: list = []
    thread = threading.Thread(target=lambda: got.append(consumer.poll(timeout=20)))
    thread.start()
    time.sleep(0.2)
    acked_at = time.monotonic()
    producer.ack(first)
    thread.join(10)
    assert got and got[0] is not None and got[0].payload == 1
    assert time.monotonic() - acked_at < 2, "the consumer waited for its safety look"


def test_rate_limit_is_exact_and_never_bursts_twice(make_queue) -> None:
    """10/s with a burst of 3: 3 at once after a quiet spell, then one every 100 ms on the
    server's clock; no start before its time, no idle gap."""
    q = make_queue("r", safety_interval=30)
    q.limits.set("api", Limit(rate=10, burst=3))
    q.offer_many(keyed(13, "api"))
    starts = []
    while len(starts) < 13:
        batch = q.poll_many(20, timeout=5)
        assert batch
        for task in batch:
            starts.append(task.delivered_at.timestamp())
            assert task.attempts == 1
            task.ack()
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts[2:])]
    for k in range(3, 13):  # hand-out times are whole ms: allow 1 ms of rounding
        assert starts[k] - starts[0] >= (k - 2) * 0.1 - 0.0011, f"early: {gaps}"
    assert max(gaps) < 0.4, f"an idle gap: {gaps}"
    for i, t in enumerate(starts):  # any 1 s window: at most rate + burst starts
        assert sum(1 for u in starts[i:] if u < t + 1.0) <= 10 + 3
    total = starts[-1] - starts[0]
    assert 0.99 <= total < 1.6, total
    assert q.limits.get("api").waiting == 0


def test_whole_queue_limit_and_default_limit(make_queue) -> None:
    q = make_queue("w")
    q.limits.set("*", Limit(concurrency=3))
    q.limits.set(q.limits.DEFAULT, Limit(concurrency=1))
    q.limits.set("vip", Limit(concurrency=5))
    q.offer_many([*keyed(3, "a"), *keyed(3, "vip", 10), (99, 0)])
    held = q.poll_many(20, timeout=2)
    payloads = sorted(t.payload for t in held)
    assert len(held) == 3, payloads  # '*' caps everything, unkeyed tasks included
    assert sum(1 for p in payloads if p < 10) <= 1, "key 'a' got more than the default 1"
    assert q.limits.get("a").limit is None and q.limits.get("a").limit_of == "~default"
    rows = {row.key: row for row in q.limits.list()}
    assert rows["*"].running == 3 and isinstance(rows["*"], LimitInfo)
    assert q.poll_many(20, timeout=0.3) == []
    for task in held:
        task.ack()
    seen = len(held)
    while seen < 7:
        batch = q.poll_many(20, timeout=3)
        assert batch and len(batch) <= 3
        seen += len(batch)
        for task in batch:
            task.ack()
    assert q.stats().total == 0


def test_limits_changed_or_removed_while_tasks_wait(make_queue) -> None:
    q = make_queue("chg")
    q.limits.set("t", Limit(concurrency=1))
    q.offer_many(keyed(6, "t"))
    first = q.poll_many(10, timeout=2)
    assert len(first) == 1 and q.limits.get("t").waiting == 5
    q.limits.set("t", Limit(concurrency=3))  # raised: two more may start at once
    more = q.poll_many(10, timeout=2)
    assert len(more) == 2 and q.poll_many(10, timeout=0.2) == []
    assert q.limits.remove("t") is True and q.limits.remove("t") is False
    rest = drain(q, 3, timeout=3)
    assert sorted(t.payload for t in first + more + rest) == list(range(6))
    q.limits.set("t", Limit(rate=1, per=60))  # added while nothing waits: applies to new ones
    q.offer_many(keyed(2, "t", 10))
    assert len(q.poll_many(10, timeout=1)) == 1
    assert q.limits.get("t").waiting == 1
    assert q.limits.get("t").next_admission_at is not None


def test_a_first_concurrency_limit_counts_the_leases_of_its_key_already_running(
    make_queue,
) -> None:
    """Leases of keyed tasks count before any limit exists: a cap of 1 set on a key while
    two of its leases run starts nothing more until both end (it started one more: the two
    were never counted, the queue having no limit then)."""
    q = make_queue("late")
    q.offer_many([Offer(i, 0, limit_key="t") for i in range(4)])
    running = q.poll_many(2, timeout=2)
    assert len(running) == 2
    q.limits.set("t", Limit(concurrency=1))
    assert q.limits.get("t").running == 2
    assert q.poll_many(10, timeout=0.5) == []
    for task in running:
        task.ack()
    (next_one,) = q.poll_many(10, timeout=5)
    assert q.limits.get("t").running == 1
    next_one.ack()


def test_the_exporters_total_is_no_limit_key(make_queue) -> None:
    """The exporter labels the queue's totals key="_all": a limit key of that name made two
    series of one label set (a scrape Prometheus refuses) and replaced the total."""
    q = make_queue("total")
    with pytest.raises(ConfigError, match="reserved"):
        q.limits.set("_all", Limit(concurrency=1))
    with pytest.raises(InvalidTaskError, match="reserved"):
        q.offer("x", 0, limit_key="_all")
    assert q.stats().total == 0


def test_parked_tasks_can_be_read_cancelled_and_expire(make_queue) -> None:
    q = make_queue("park")
    q.limits.set("t", Limit(concurrency=1))
    ids = q.offer_many([*keyed(2, "t"), Offer("ttl", 0, limit_key="t", ttl=0.3)])
    assert q.poll(timeout=2) is not None
    assert q.poll(timeout=0.2) is None  # parks the other two
    info = q.get(ids[1])
    assert info is not None and info.state is TaskState.READY and info.payload == 1
    assert q.cancel(ids[1]) is True and q.get(ids[1]) is None
    wait_until(lambda: q.poll(timeout=0) is None and q.get(ids[2]) is None, timeout=5)
    assert q.stats().counters.get("expired") == 1
    assert q.limits.get("t").waiting == 0


def test_bad_limits_and_limit_keys_are_refused(make_queue) -> None:
    for bad in (
        {"rate": 0},
        {"rate": float("nan")},
        {"rate": True},
        {},
        {"burst": 3},
        {"rate": 1, "burst": 0},
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"rate": 1, "per": 0},
        {"rate": 1, "weight": 0},
    ):
        with pytest.raises(ConfigError):
            Limit(**bad)  # type: ignore[arg-type]
    q = make_queue("bad")
    for key in ("", "a|b", "~other", 5):
        with pytest.raises(ConfigError):
            q.limits.set(key, Limit(concurrency=1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        q.limits.set("t", {"concurrency": 1})  # type: ignore[arg-type]
    for key in ("*", "~default", "a|b", ""):
        with pytest.raises(InvalidTaskError):
            q.offer("x", 0, limit_key=key)
    assert q.stats().total == 0 and q.limits.list() == []


def test_a_limit_round_trips() -> None:
    for limit in (
        Limit(rate=5),
        Limit(rate=2.5, per=timedelta(minutes=1), burst=4),
        Limit(concurrency=3, weight=5),
        Limit(rate=100, per=0.5, concurrency=2),
    ):
        again = Limit.decode(limit.encode())
        assert again.encode() == limit.encode()


def test_a_sharded_queue_routes_a_limit_key_to_one_shard(make_queue, client) -> None:
    q = make_queue("sh", shards=4)
    with pytest.raises(ConfigError, match="sharded"):
        q.limits.set("*", Limit(concurrency=1))
    q.limits.set("t", Limit(concurrency=2))
    q.offer_many(keyed(8, "t"))
    held = q.poll_many(20, timeout=2)
    assert len(held) == 2, "the limit was not exact across shards"
    assert len({t._shard.name for t in held}) == 1
    assert q.limits.get("t").waiting == 6
    for task in held:
        task.ack()
    rest = []
    while len(rest) < 6:
        batch = q.poll_many(20, timeout=3)
        assert batch and len(batch) <= 2
        rest += batch
        for task in batch:
            task.ack()
    mismatched = next(k for k in (f"k{i}" for i in range(100)) if _apart(k, "t", 4))
    with pytest.raises(InvalidTaskError, match="one shard"):
        q.offer("x", 0, key=mismatched, limit_key="t")


def _apart(a: str, b: str, shards: int) -> bool:
    return shard_of(a, shards) != shard_of(b, shards)


def test_a_queue_without_limits_keeps_no_limit_state(make_queue, client: redis.Redis) -> None:
    q = make_queue("plain")
    q.offer_many([(i, 0) for i in range(5)])
    q.offer("keyed", 0, limit_key="t")  # a key without any limit: handed out as usual
    for task in drain(q, 6):
        task.ack()
    names = {k.decode() for k in client.keys(f"{q.keys.prefix}:*")}
    assert not any(":lim:" in n or n.endswith(":lim") for n in names - {q.keys.key("x")}), names


async def test_async_limits(make_async_queue) -> None:
    q = make_async_queue("al")
    await q.limits.set("t", Limit(concurrency=1))
    await q.offer_many(keyed(2, "t"))
    first = await q.poll_many(10, timeout=2)
    assert len(first) == 1
    assert (await q.limits.get("t")).waiting == 1
    await first[0].ack()
    second = await q.poll(timeout=2)
    assert second is not None and second.payload == 1
    await second.ack()
    assert [row.key for row in await q.limits.list()] == ["t"]
    assert await q.limits.remove("t")


def test_whole_queue_rate_is_kept_and_batched(make_queue) -> None:
    """'*' at 20/s, burst 4, over unkeyed tasks: never more than rate + burst in a second,
    the span as GCRA says, and consumers wake for batches (up to the burst) when throttled."""
    q = make_queue("star", safety_interval=30)
    q.limits.set("*", Limit(rate=20, burst=4))
    q.offer_many([(i, 0) for i in range(24)])
    starts, fetched = [], 0
    while len(starts) < 24:
        batch = q.poll_many(10, timeout=5)
        assert batch
        fetched += 1
        for task in batch:
            starts.append(task.delivered_at.timestamp())
            task.ack()
    starts.sort()
    for i, t in enumerate(starts):
        assert sum(1 for u in starts[i:] if u < t + 1.0) <= 20 + 4
    assert 0.99 <= starts[-1] - starts[0] < 1.6, starts[-1] - starts[0]
    assert fetched <= 8, f"{fetched} hand-outs for 24 tasks: throttled consumers fetch one by one"


def test_the_exporter_reports_pause_and_limits(make_queue, redis_url: str) -> None:
    from delayq.metrics import QueueCollector

    q = make_queue("m")
    q.limits.set("t", Limit(concurrency=1))
    q.offer_many(keyed(3, "t"))
    q.offer_many(keyed(1, 'odd "key"\n'))
    leased = q.poll_many(10, timeout=2)
    assert len(leased) == 2
    q.pause()
    collector = QueueCollector(redis_url, prefix=q.keys.prefix, queues=["m"])
    try:
        text = collector.render()
    finally:
        collector.close()
    assert 'delayq_queue_paused{queue="m"} 1' in text
    assert 'delayq_limit_waiting{queue="m",key="_all"} 2' in text
    assert 'delayq_limit_waiting{queue="m",key="t"} 2' in text
    assert 'delayq_limit_running{queue="m",key="_all"} 2' in text
    assert 'delayq_limit_running{queue="m",key="odd \\"key\\"\\n"} 1' in text
    assert 'delayq_limit_throttled_total{queue="m",key="_all",reason="concurrency"} 2' in text
    assert 'delayq_limit_throttled_total{queue="m",key="t",reason="concurrency"} 2' in text
    assert 'delayq_limit_throttled_total{queue="m",key="_all",reason="rate"} 0' in text
    stats = q.stats()
    assert stats.limit_waiting == {"": 2, "t": 2} and stats.limit_running["t"] == 1
    assert stats.limit_throttled == {"concurrency": {"t": 2}}


def test_flow_control_survives_a_script_flush(make_queue, client: redis.Redis) -> None:
    q = make_queue("flush")
    client.script_flush()
    q.limits.set("t", Limit(concurrency=1))
    client.script_flush()
    assert q.limits.get("t").limit == Limit(concurrency=1)
    client.script_flush()
    q.pause(until=timedelta(minutes=1))
    client.script_flush()
    assert q.resume()
    client.script_flush()
    assert q.limits.list()[0].key == "t" and q.limits.remove("t")


def test_throttled_consumers_are_told_their_turns_one_batch_apart(make_queue) -> None:
    """'*' at 5/s, burst 5: the consumer that takes the burst is told when the next batch
    may start (it does not look again at once), and a second consumer refused meanwhile is
    told the batch after that, so one consumer, not both, wakes per batch."""
    first, second = make_queue("turns", safety_interval=30), make_queue("turns")
    first.limits.set("*", Limit(rate=5, burst=5))
    first.offer_many([(i, 0) for i in range(20)])
    assert len(first.poll_many(5, timeout=0)) == 5
    assert second.poll_many(5, timeout=0) == []  # a token comes back every 200 ms
    now = time.monotonic()
    first_at = first._watch(first._all()[0]).quiet_until()
    second_at = second._watch(second._all()[0]).quiet_until()
    assert first_at is not None and second_at is not None, "told to look again at once"
    # 5 tokens come back in 1 s: the first consumer's next batch, then the second's
    assert 0.6 < first_at - now <= 1.05, first_at - now
    assert 0.9 <= second_at - first_at <= 1.05, second_at - first_at
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < 15 and time.monotonic() < deadline:  # in turns, 5 (or a few) a time
        got += first.poll_many(5, timeout=1.5) + second.poll_many(5, timeout=1.5)
    assert len(got) == 15 and all(t.attempts == 1 for t in got)
    assert len({t.payload for t in got}) == 15


def test_a_fetch_that_took_all_that_was_due_waits_for_the_next_due_time(
    make_queue, client: redis.Redis
) -> None:
    """Three due now, the next in 30 s: the fetch that took the three records that nothing
    is due before then, and the next poll does not send a fetch to find out; a task offered
    due now is still announced and taken at once."""
    q = make_queue("short", safety_interval=60)
    q.offer_many([(i, 0) for i in range(3)])
    q.offer("later", delay=30)
    assert sorted(t.payload for t in q.poll_many(10, timeout=0)) == [0, 1, 2]
    until = q._watch(q._all()[0]).quiet_until()
    assert until is not None and until - time.monotonic() > 20, until
    scripts_before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert q.poll_many(10, timeout=0.3) == []
    assert client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) == (
        scripts_before
    ), "the poll fetched although nothing was due"
    q.offer("now", delay=0)
    assert [t.payload for t in q.poll_many(10, timeout=5)] == ["now"]


def test_a_throttled_worker_fetches_its_whole_room_at_its_turn(make_queue) -> None:
    """'*' at 40/s, burst 20, a worker holding up to 20 (4 handlers of 30 ms, 16 ahead): a
    batch is handled in ~150 ms, its next turn comes 500 ms after the last, and the fetch
    sent at the turn asks for the room there is then (20), not the 16 slots free when its
    buffer emptied and it began to wait."""
    q = make_queue("whole-room", safety_interval=30)
    q.limits.set("*", Limit(rate=40, burst=20))
    q.offer_many([(i, 0) for i in range(100)])
    asked: list[tuple[int, int]] = []
    poll_many = q.poll_many

    def spy_poll(max_tasks: int, timeout: float = 0.0) -> list:
        got = poll_many(max_tasks, timeout)
        if got:
            asked.append((max_tasks, len(got)))
        return got

    q.poll_many = spy_poll  # type: ignore[method-assign]
    done: list[int] = []

    def handler(task) -> None:
        time.sleep(0.03)  # the work; the turn comes long after it
        done.append(task.payload)

    worker = Worker(q, handler, concurrency=4, prefetch=16)
    background = worker.start_background()
    try:
        wait_until(lambda: len(done) == 100, timeout=20)
    finally:
        background.stop()
    assert sorted(done) == list(range(100))
    assert sum(got for _, got in asked) == 100, asked
    later = asked[1:]  # the first fetch came before the limit's turns
    assert later and all(want == 20 for want, _ in later[:-1]), asked
    assert len(asked) <= 7, asked
