"""Sharded queues: one logical queue over N sub-queues with their own hash tags, on a single
Redis and on a cluster; routing by dedup key and id, fair consumption, merged stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from redis.cluster import RedisCluster

from delayq import (
    AsyncDelayQueue,
    ConfigError,
    DelayQueue,
    Limit,
    Offer,
    Worker,
)
from delayq._core import sharding
from delayq._core.keys import QueueKeys
from delayq._sync.reshard import finish_reshard, reshard
from delayq.embedded import EmbeddedCluster
from delayq.metrics import QueueCollector

from ..conftest import BINARIES
from ..helpers import wait_until

CLI = [sys.executable, "-m", "delayq.cli"]


def test_shard_names_spread_over_the_slot_space() -> None:
    names = sharding.shard_names("orders", 16)
    assert names == sharding.shard_names("orders", 16)  # every client computes the same
    slots = [sharding.key_slot(n) for n in names]
    assert [s * 16 // sharding.SLOTS for s in slots] == list(range(16))
    with pytest.raises(ConfigError):
        sharding.check_shards(0)
    with pytest.raises(ConfigError):
        sharding.shard_names("x" * 190, 4)


def test_a_sharded_queue_is_the_one_queue_class(make_queue) -> None:
    q = make_queue("orders", shards=4)
    assert type(q) is DelayQueue and q.shards is None  # the layout is read on first use
    q.offer(1, delay=60)
    assert q.shards == 4
    plain = make_queue("plain")
    assert type(plain) is DelayQueue
    plain.offer(1, delay=60)
    assert plain.shards == 1


def test_offers_spread_over_shards_and_come_back(make_queue, client, prefix) -> None:
    q = make_queue("orders", shards=4, visibility_timeout=5)
    ids = q.offer_many([(n, 0) for n in range(400)])
    single = q.offer("one", delay=0)
    per_shard = [part.ready for part in q.stats().shards]
    assert sum(per_shard) == 401 and min(per_shard) > 50  # spread, roughly evenly
    assert q.get(single).payload == "one"  # found on its shard by id alone
    got: list[str] = []
    while len(got) < 401:
        batch = q.poll_many(50, timeout=2)
        assert batch, "every task comes back"
        got += [t.id for t in batch]
        assert all(q.ack_many(batch))
    assert sorted(got) == sorted([*ids, single])
    stats = q.stats()
    assert (stats.ready, stats.inflight, stats.counters["acked"]) == (0, 0, 401)
    assert len(stats.shards) == 4 and sum(s.counters["acked"] for s in stats.shards) == 401
    # The logical queue is registered, its shards are not.
    assert client.smembers(f"{prefix}:queues") == {b"orders"}
    assert client.hget(f"{prefix}:shards", "orders") == b"4"


def test_dedup_key_holds_across_shards(make_queue) -> None:
    q = make_queue("orders", shards=8)
    first = q.offer("close 42", delay=60, key="close:42")
    again = q.offer("close 42 again", delay=60, key="close:42")
    assert again == first and again.outcome == "existing"
    many = q.offer_many([Offer("close 42", 60, key="close:42"), Offer("other", 60, key="k2")])
    assert many[0] == first
    assert q.stats().delayed == 2
    assert q.cancel(first)  # an id drawn for the key's shard: found without asking others


def test_caller_id_with_a_key_is_still_found_by_id(make_queue) -> None:
    q = make_queue("orders", shards=8)
    task_id = q.offer("x", delay=60, id="order-7-close", key="order:7")
    assert task_id == "order-7-close"
    info = q.get("order-7-close")
    assert info is not None and info.key == "order:7"
    assert q.reschedule("order-7-close", delay=120)
    assert q.cancel("order-7-close")
    assert q.get("order-7-close") is None
    assert not q.cancel("order-7-close")


def test_a_different_shard_count_is_refused_and_none_follows_redis(make_queue) -> None:
    q = make_queue("orders", shards=4)
    q.offer(1, delay=60)
    with pytest.raises(ConfigError, match=r"has 4 shard\(s\) in Redis, not 8"):
        make_queue("orders", shards=8).offer(1, delay=60)
    with pytest.raises(ConfigError, match=r"has 4 shard\(s\)"):
        make_queue("orders", shards=2).poll(timeout=0)  # consumers too
    follower = make_queue("orders")  # no shards=: the layout Redis recorded
    follower.offer(2, delay=60)
    assert follower.shards == 4 and q.stats().delayed == 2
    plain = make_queue("plain")
    plain.offer(1, delay=60)
    with pytest.raises(ConfigError, match="unsharded in Redis"):
        make_queue("plain", shards=4).offer(1, delay=60)


def test_consumers_take_from_every_shard_fairly(make_queue) -> None:
    """A busy shard does not starve the others: each poll starts at the next shard."""
    q = make_queue("orders", shards=4)
    busy_ids = set()
    draws = iter(range(10**6))
    for n in range(200):
        task_id = sharding.id_for_shard(0, 4, lambda: f"busy-{next(draws)}")
        busy_ids.add(q.offer(n, delay=0, id=task_id))
    others = set(q.offer_many([(n, 0) for n in range(30)])) - busy_ids
    seen_other_at = []
    for i in range(20):
        batch = q.poll_many(5, timeout=2)
        q.ack_many(batch)
        if any(t.id in others for t in batch):
            seen_other_at.append(i)
    assert seen_other_at and seen_other_at[0] < 4
    assert q.stats().shards[0].ready > 0  # the busy shard still had work: none was starved


def test_an_idle_sharded_consumer_looks_at_each_shard_once_then_sleeps(
    make_queue, redis_server
) -> None:
    q = make_queue("idle", shards=8, safety_interval=30)
    q.offer("later", delay=60)
    raw = redis.Redis.from_url(redis_server.url)
    q.poll(timeout=0)  # one look at every shard
    before = int(raw.info("stats")["total_commands_processed"])
    assert q.poll(timeout=1.0) is None
    spent = int(raw.info("stats")["total_commands_processed"]) - before
    raw.close()
    assert spent <= 3, f"an idle consumer polled empty shards ({spent} commands)"


def test_a_wakeup_on_any_shard_ends_the_wait(make_queue) -> None:
    consumer = make_queue("wake", shards=8, safety_interval=30)
    producer = make_queue("wake", shards=8)
    assert consumer.poll(timeout=0) is None
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(consumer.poll(timeout=10)))
    started = time.monotonic()
    thread.start()
    time.sleep(0.1)  # the consumer is waiting (not a correctness assumption: it is bounded)
    task_id = producer.offer("now", delay=0.05)
    thread.join(10)
    assert result and getattr(result[0], "id", None) == task_id
    assert time.monotonic() - started < 5


def test_worker_on_a_sharded_queue(make_queue) -> None:
    q = make_queue("work", shards=4, visibility_timeout=5)
    ids = set(q.offer_many([(n, 0) for n in range(300)]))
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(task) -> None:
        with lock:
            done[task.id] += 1

    worker = Worker(q, handle, concurrency=4)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_until(lambda: len(done) == 300, timeout=20)
    worker.stop()
    thread.join(20)
    assert set(done) == ids and max(done.values()) == 1
    wait_until(lambda: q.stats().counters.get("acked", 0) == 300, timeout=10)


async def test_async_sharded_queue(make_async_queue) -> None:
    q = make_async_queue("orders", shards=4)
    assert type(q) is AsyncDelayQueue
    ids = await q.offer_many([(n, 0) for n in range(100)])
    got = []
    while len(got) < 100:
        batch = await q.poll_many(40, timeout=2)
        assert batch
        got += batch
        await q.ack_many(batch)
    assert sorted(t.id for t in got) == sorted(ids)
    assert (await q.stats()).counters["acked"] == 100


# -- on a cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


def test_sixteen_shards_spread_over_three_masters(cluster: EmbeddedCluster, prefix: str) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
    with DelayQueue("promo", url, prefix=prefix, shards=16) as q:
        client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        subs = [QueueKeys(prefix, n) for n in sharding.shard_names("promo", 16)]
        owners = Counter(client.get_node_from_key(k.all[0]).name for k in subs)
        client.close()
        assert len(owners) == 3 and all(4 <= n <= 7 for n in owners.values()), owners
        ids = q.offer_many([(n, 0) for n in range(1000)])
        got = []
        while len(got) < 1000:
            batch = q.poll_many(100, timeout=2)
            assert batch
            got += [t.id for t in batch]
            assert all(q.ack_many(batch))
        assert sorted(got) == sorted(ids)
        stats = q.stats()
        assert stats.counters["acked"] == 1000 and stats.ready == 0


def test_exporter_and_cli_show_the_logical_queue_with_its_shards(
    make_queue, redis_server, prefix
) -> None:
    q = make_queue("promo", shards=4)
    q.offer_many([(n, 60) for n in range(40)])
    make_queue("plain").offer("x", delay=60)
    collector = QueueCollector(redis_server.url, prefix=prefix)
    try:
        by_name = {s.queue: s for s in collector.read()}
        text = collector.render()
    finally:
        collector.close()
    assert by_name["promo"].delayed == 40 and len(by_name["promo"].shards) == 4
    assert by_name["plain"].delayed == 1 and by_name["plain"].shards == ()
    assert 'delayq_tasks{queue="promo",state="delayed"} 40' in text
    shard_lines = [line for line in text.splitlines() if line.startswith("delayq_shard_tasks{")]
    delayed = [line for line in shard_lines if 'state="delayed"' in line]
    assert len(delayed) == 4 and sum(int(line.split()[-1]) for line in delayed) == 40

    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [*CLI, "stats", "promo", "--json", "--redis", redis_server.url, "--prefix", prefix],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["delayed"] == 40


# -- resharding a live queue ----------------------------------------------------------------


def test_reshard_a_plain_queue_live(make_queue, redis_server, prefix, client) -> None:
    old = make_queue("orders")
    old_ids = old.offer_many([(n, 0.5) for n in range(50)])
    held = old.offer("held by key", delay=60, key="close:42")
    assert reshard("orders", redis_server.url, shards=4, prefix=prefix) == "4<0"
    assert client.hget(f"{prefix}:shards", "orders") == b"4<0"
    q = make_queue("orders", visibility_timeout=5)  # follows the recorded layout
    # A dedup key still live in the old layout stays there: dedup holds across the move.
    assert q.offer("again", delay=60, key="close:42") == held
    assert q.get(held) is not None and q.get(old_ids[0]) is not None
    new_ids = q.offer_many([(n, 0) for n in range(20)])
    assert q.stats().total == 71  # both layouts counted
    with pytest.raises(ConfigError, match=r"still in the previous layout \(unsharded\)"):
        finish_reshard("orders", redis_server.url, prefix=prefix, grace=0)
    got: Counter[str] = Counter()
    while sum(got.values()) < 70:
        batch = q.poll_many(50, timeout=3)
        assert batch, "both layouts drain"
        got.update(t.id for t in batch)
        assert all(q.ack_many(batch))
    assert set(got) == {*old_ids, *new_ids} and max(got.values()) == 1
    assert q.cancel(held)  # found in the old layout by id
    assert finish_reshard("orders", redis_server.url, prefix=prefix, grace=0) == "4"
    assert client.hget(f"{prefix}:shards", "orders") == b"4"
    with pytest.raises(ConfigError, match="not being resharded"):
        finish_reshard("orders", redis_server.url, prefix=prefix, grace=0)


def test_a_reshard_keeps_the_pause_and_the_keys_limits(make_queue, redis_server, prefix) -> None:
    """Before: the new layout's sub-queues were neither paused nor limited, so a paused queue
    handed out the tasks offered after a reshard, and a key's limit held only for its tasks
    in the old layout."""
    old = make_queue("held")
    paused = old.pause(until=datetime.now(UTC) + timedelta(hours=1), note="provider down")
    old.limits.set("tenant", Limit(concurrency=1))
    reshard("held", redis_server.url, shards=4, prefix=prefix)
    q = make_queue("held", visibility_timeout=30)
    q.offer_many([Offer(n, 0, limit_key="tenant") for n in range(3)])
    assert q.poll_many(10, timeout=0.5) == []  # still paused, in both layouts
    again = q.pause(note="provider down")  # the new layout's first sub-queue answers
    assert again.since == paused.since  # the pause carried kept its start
    assert q.resume() is True
    first = q.poll_many(10, timeout=5)
    assert len(first) == 1, "the key's limit must hold in the new layout"
    assert q.poll_many(10, timeout=0.3) == []
    first[0].ack()
    assert len(q.poll_many(10, timeout=5)) == 1


def test_a_keys_counts_are_read_on_its_shard_during_a_reshard(
    make_queue, redis_server, prefix
) -> None:
    """limits.get(key) while a reshard is under way reads the key's shard of each layout, as
    limits.list() does (before: shard_of(key, 5) over the 4 new shards and the old one, often
    a shard without the key: 0 running, 0 waiting)."""
    key = next(
        f"t{i}"
        for i in range(100)
        if sharding.shard_of(f"t{i}", 5) != sharding.shard_of(f"t{i}", 4)
    )
    make_queue("split").offer("in the old layout", 3600)
    reshard("split", redis_server.url, shards=4, prefix=prefix)
    q = make_queue("split")
    q.limits.set(key, Limit(concurrency=2))
    q.offer_many([Offer(n, 0, limit_key=key) for n in range(5)])
    assert len(q.poll_many(10, timeout=5)) == 2
    listed = {row.key: row for row in q.limits.list()}[key]
    got = q.limits.get(key)
    assert (listed.running, listed.waiting) == (2, 3)
    assert (got.limit, got.running, got.waiting) == (Limit(concurrency=2), 2, 3)


def test_a_finished_reshard_keeps_the_queues_counts(make_queue, redis_server, prefix) -> None:
    """The counts since the queue began (offered, acked, lateness...) do not drop when a
    reshard finishes, through two reshards (before: stats and the exporter read only the new
    layout, and the old one's counts were gone: offered 5 -> 0, a counter going back)."""
    q = make_queue("counted")
    q.offer_many([(n, 0) for n in range(5)])
    assert all(q.ack_many(q.poll_many(5, timeout=5)))
    before = q.stats()
    assert (before.counters["offered"], before.counters["acked"]) == (5, 5)
    for shards, recorded in ((4, "4"), (2, "2")):
        reshard("counted", redis_server.url, shards=shards, prefix=prefix)
        assert finish_reshard("counted", redis_server.url, prefix=prefix, grace=0) == recorded
        after = make_queue("counted").stats()
        assert after.counters == before.counters, shards
        assert (after.lateness, after.lateness_sum) == (before.lateness, before.lateness_sum)


def _two_shards(make_queue, redis_server, prefix, name):
    reshard(name, redis_server.url, shards=2, prefix=prefix)
    finish_reshard(name, redis_server.url, prefix=prefix, grace=0)
    return make_queue(name)


@pytest.mark.parametrize("many", [False, True])
def test_a_limit_keyed_offer_with_its_own_id_sent_again_during_a_reshard_matches_its_task(
    make_queue, redis_server, prefix, many
) -> None:
    """A producer's retry of offer(id=X, limit_key=K) after a reshard began: X was placed by
    K in the old layout, and is looked for there (before: on X's shard, so a second task X
    was made in the new layout)."""
    q = _two_shards(make_queue, redis_server, prefix, "byid")
    own = next(
        f"o{i}" for i in range(100) if sharding.shard_of(f"o{i}", 2) != sharding.shard_of("t", 2)
    )
    offer = Offer({"n": 1}, 60, id=own, limit_key="t")
    first = q.offer_many([offer])[0] if many else q.offer({"n": 1}, 60, id=own, limit_key="t")
    reshard("byid", redis_server.url, shards=4, prefix=prefix)
    again = make_queue("byid")
    second = (
        again.offer_many([offer])[0] if many else again.offer({"n": 1}, 60, id=own, limit_key="t")
    )
    assert second == first and second.outcome == "existing", second.outcome
    assert again.stats().delayed == 1


def test_a_stale_producers_limit_keyed_offers_go_to_the_keys_shard_after_a_finish(
    make_queue, redis_server, prefix
) -> None:
    """A producer that had not re-read the layout when a reshard finished writes again by
    the new one: a limit key's tasks to that key's shard (so its limit stays exact), not
    each to its id's (before: spread over the shards, each counting the limit apart)."""
    _two_shards(make_queue, redis_server, prefix, "stale")
    stale = make_queue("stale", safety_interval=3600)
    assert stale.cancel(stale.offer("warm", 60))  # it reads the layout: 2 shards
    reshard("stale", redis_server.url, shards=4, prefix=prefix)
    finish_reshard("stale", redis_server.url, prefix=prefix, grace=0)
    stale.offer_many([Offer(n, 60, limit_key="tenant") for n in range(8)])
    parts = [p.delayed for p in make_queue("stale").stats().shards]
    assert sorted(parts) == [0, 0, 0, 8], parts  # one shard holds the key's eight tasks


def test_a_whole_queue_limit_refuses_a_reshard_and_nothing_changes(
    make_queue, redis_server, prefix, client
) -> None:
    q = make_queue("capped")
    q.limits.set("*", Limit(rate=100))
    with pytest.raises(ConfigError, match="whole-queue limit"):
        reshard("capped", redis_server.url, shards=2, prefix=prefix)
    assert client.hget(f"{prefix}:shards", "capped") is None  # no layout recorded
    assert not any(b"~" in k for k in client.keys(f"{prefix}:*capped*"))  # no sub-queue made
    q.limits.remove("*")
    assert reshard("capped", redis_server.url, shards=2, prefix=prefix) == "2<0"


def test_reshard_sharded_to_more_shards_with_a_worker_running(
    make_queue, redis_server, prefix
) -> None:
    q4 = make_queue("promo", shards=4)
    before = q4.offer_many([(n, 0.3) for n in range(200)])
    reshard("promo", redis_server.url, shards=8, prefix=prefix)
    with pytest.raises(ConfigError, match="already being resharded"):
        reshard("promo", redis_server.url, shards=16, prefix=prefix)
    q8 = make_queue("promo", shards=8, visibility_timeout=5)
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(task) -> None:
        with lock:
            done[task.id] += 1

    worker = Worker(q8, handle, concurrency=4)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        after = q8.offer_many([(n, 0) for n in range(200)])
        wait_until(lambda: len(done) == 400, timeout=20)
    finally:
        worker.stop()
        thread.join(20)
    assert set(done) == {*before, *after} and max(done.values()) == 1
    wait_until(lambda: q8.stats().total == 0, timeout=10)
    assert finish_reshard("promo", redis_server.url, prefix=prefix, grace=0) == "8"


def test_a_key_kept_after_its_task_finished_still_blocks_after_the_reshard_finishes(
    make_queue, redis_server, prefix
) -> None:
    """key_ttl keeps a finished task's dedup key taken (docs/guarantees.md). finish_reshard
    moves such keys to their shard in the new layout: offers stopped looking at the old one,
    and a repeated offer made a second task."""
    # unsharded -> 4, then 4 -> 5, which share promo~0.3: its keys that route elsewhere in
    # the new layout move too
    q = make_queue("promo", visibility_timeout=30)
    firsts = [q.offer("close", 0, key=f"close:{i}", key_ttl=3600) for i in range(20)]
    for _ in firsts:
        q.take().ack()
    for shards in (4, 5):
        reshard("promo", redis_server.url, shards=shards, prefix=prefix)
        during = make_queue("promo")
        assert during.offer("close", 0, key="close:0", key_ttl=3600) == firsts[0]
        assert finish_reshard("promo", redis_server.url, prefix=prefix, grace=0) == str(shards)
        after = make_queue("promo")
        again = [after.offer("close", 0, key=f"close:{i}", key_ttl=3600) for i in range(20)]
        assert again == firsts and {t.outcome for t in again} == {"existing"}
        assert after.stats().total == 0


@pytest.mark.parametrize("by_id", [True, False], ids=["by-id", "all"])
def test_a_dead_task_whose_key_a_new_task_holds_stays_dead_during_a_reshard(
    make_queue, redis_server, prefix, by_id
) -> None:
    """requeue_dead leaves a dead task dead while another task holds its dedup key. During a
    reshard the dead task waits in the old layout and the new holder in the new one, which
    requeue.lua does not see: both ran (two live tasks for one key)."""
    q = make_queue("deadkey", visibility_timeout=30)
    first = q.offer("event", 0, key="order:9")
    other = q.offer("other", 0, key="order:10")
    for _ in range(2):
        q.take().reject("boom")
    reshard("deadkey", redis_server.url, shards=4, prefix=prefix)
    during = make_queue("deadkey")
    second = during.offer("event again", 60, key="order:9")
    assert second != first and second.outcome == "created"
    if by_id:
        assert during.requeue_dead(first) == 0
        assert during.requeue_dead(other) == 1  # its key is free
    else:
        assert during.requeue_dead() == 1  # "other" only
    stats = during.stats()
    assert (stats.dead, stats.delayed + stats.ready) == (1, 2)
    assert [d.id for d in during.dead()] == [first]


def test_a_finished_reshard_keeps_each_limit_keys_throttle_counts(
    make_queue, redis_server, prefix
) -> None:
    """reshard --finish carries the per-key counts of tasks held back by a limit (stats'
    limit_throttled, the exporter's delayq_limit_throttled_total{key}) as it carries the
    queue's: they were dropped, and a Prometheus counter went back."""
    q = make_queue("thr")
    q.limits.set("t", Limit(concurrency=1))
    q.offer_many([Offer(n, 0, limit_key="t") for n in range(3)])
    done = 0
    while done < 3:
        got = q.poll_many(10, timeout=2)
        assert len(got) <= 1  # one at a time: the others are held back
        done += len(got)
        assert all(q.ack_many(got))
    before = q.stats()
    assert before.limit_throttled.get("concurrency", {}).get("t", 0) >= 2
    reshard("thr", redis_server.url, shards=2, prefix=prefix)
    assert finish_reshard("thr", redis_server.url, prefix=prefix, grace=0) == "2"
    after = make_queue("thr").stats()
    assert after.limit_throttled == before.limit_throttled
    assert after.counters["throttled:concurrency"] == before.counters["throttled:concurrency"]


def test_reshard_command(make_queue, redis_server, prefix) -> None:
    make_queue("mail").offer("x", delay=60)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    base = ["--redis", redis_server.url, "--prefix", prefix]
    started = subprocess.run(
        [*CLI, "reshard", "mail", "--shards", "2", *base], capture_output=True, text=True, env=env
    )
    assert started.returncode == 0, started.stderr
    assert "resharding from unsharded to 2" in started.stdout
    refused = subprocess.run(
        [*CLI, "reshard", "mail", "--finish", *base], capture_output=True, text=True, env=env
    )
    assert refused.returncode != 0 and "1 task(s) still" in refused.stderr
    assert "Traceback" not in refused.stderr
    # A misspelt name is refused as by every other command; it made a new sharded queue.
    for args in (["--shards", "4"], ["--finish"]):
        misspelt = subprocess.run(
            [*CLI, "reshard", "mial", *args, *base], capture_output=True, text=True, env=env
        )
        assert misspelt.returncode == 1 and "did you mean 'mail'" in misspelt.stderr
    listed = subprocess.run([*CLI, "queues", *base], capture_output=True, text=True, env=env)
    assert listed.stdout.split() == ["mail"]


def test_stats_command_shows_each_shard(make_queue, redis_server, prefix) -> None:
    q = make_queue("promo", shards=3)
    q.offer_many([(n, 60) for n in range(30)])
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [*CLI, "stats", "promo", "--redis", redis_server.url, "--prefix", prefix],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    shards = [line for line in lines if line.startswith("promo  shard ")]
    (total,) = [line for line in lines if line.startswith("promo ") and line not in shards]
    assert total.split()[1] == "30" and len(shards) == 3
    assert sum(int(line.split()[4]) for line in shards) == 30
