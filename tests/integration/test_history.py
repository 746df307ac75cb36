"""Task history against real Redis (issue #22): every event kind, written by the script that
makes the change; get() after the end; retention (waited on by the key's TTL); bounded size;
a requeue that continues a history; the setting in Redis, seen by every client; history off
leaves no key and sends no command to one; sharded queues and resharding. (The cluster tests
are in test_cluster.py, the CLI's in tests/acceptance/test_cli_history.py, the dashboard's
in test_dashboard_http.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import redis

from delayq import (
    AsyncDelayQueue,
    Backoff,
    ConfigError,
    DelayQueue,
    HistoryKind,
    HistorySettings,
    Offer,
    TaskState,
)
from delayq._core.history import origin
from delayq._sync.reshard import finish_reshard, reshard
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay
from delayq.redisson import Migration
from tests.helpers import wait_until
from tests.redisson_emulation import RedissonClient

from ..conftest import BINARIES

pytest_plugins = ["tests.outbox_support"]

Make = Callable[..., DelayQueue]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "handlers.py", line 12, in close_order\n'
    "    raise ValueError(order)\n"
    "ValueError: order 42 is locked\n"
)


def kinds(q: DelayQueue, task_id: str) -> list[str]:
    return [e.kind for e in q.history(task_id)]


def hist_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(k for k in client.scan_iter(f"{prefix}:*") if b":hist" in k)


def history_key(q: DelayQueue, task_id: str, shard: str | None = None) -> str:
    return f"{q.keys.prefix}:{{{shard or q.name}}}:hist:{task_id}"


# -- every event kind ---------------------------------------------------------------------------


def test_a_task_that_fails_then_succeeds(make_queue: Make) -> None:
    q = make_queue("orders", history=60, max_attempts=5)
    task_id = q.offer({"order": 42}, 0)
    task = q.poll(timeout=5)
    assert task is not None and task.id == task_id
    task.extend(20)
    task.retry(0, error=TRACEBACK)
    task = q.poll(timeout=5)
    assert task is not None
    task.ack()
    events = q.history(task_id)
    assert [e.kind for e in events] == [
        "offered", "delivered", "extended", "retried", "delivered", "acked",
    ]  # fmt: skip
    offered, delivered, extended, retried, again, acked = events
    assert offered.kind is HistoryKind.OFFERED
    assert offered.detail == f"by {origin()}, due now" and offered.attempt == 0
    assert delivered.attempt == 1 and delivered.detail.startswith(f"to {origin()}")
    assert extended.attempt == 1 and extended.detail == "lease ends in 20.0s"
    assert retried.attempt == 1 and retried.detail == "ValueError: order 42 is locked"
    assert again.attempt == 2 and acked.attempt == 2 and acked.detail == ""
    assert [e.at for e in events] == sorted(e.at for e in events)  # Redis's clock, in order
    info = q.get(task_id)
    assert info is not None and info.state is TaskState.DONE and info.outcome == "acked"
    assert info.attempts == 2 and info.ended_at == acked.at and info.payload is None


def test_due_times_reschedule_replace_and_cancel(make_queue: Make) -> None:
    q = make_queue("mail", history=60)
    task_id = q.offer("hello", 1800, key="welcome:7", dedup="replace")
    assert q.offer("hello again", 90, key="welcome:7", dedup="replace") == task_id
    assert q.reschedule(task_id, 3600 * 26)
    assert q.cancel(task_id)
    events = q.history(task_id)
    assert [(e.kind, e.detail) for e in events] == [
        ("offered", f"by {origin()}, due in 30m00s"),
        ("replaced", f"by {origin()}, due in 1m30s"),
        ("rescheduled", "due in 1d02h"),
        ("cancelled", ""),
    ]
    info = q.get(task_id)
    assert info is not None and info.state is TaskState.CANCELLED and info.outcome == "cancelled"
    assert q.get("never-offered") is None


def test_dead_letters_requeue_continues_the_same_history(make_queue: Make) -> None:
    q = make_queue("dl", history=60, max_attempts=2)
    task_id = q.offer("x", 0)
    for _ in range(2):
        task = q.poll(timeout=5)
        assert task is not None
        task.retry(0, error=TRACEBACK)
    assert q.get(task_id).state is TaskState.DEAD  # type: ignore[union-attr]
    assert q.requeue_dead(task_id) == 1
    task = q.poll(timeout=5)
    assert task is not None and task.attempts == 1
    task.reject("not worth a retry")
    assert q.requeue_dead(task_id) == 1
    task = q.poll(timeout=5)
    assert task is not None
    task.ack()
    events = q.history(task_id)
    assert [(e.kind, e.attempt) for e in events] == [
        ("offered", 0), ("delivered", 1), ("retried", 1), ("delivered", 2),
        ("dead-lettered", 2), ("requeued", 0), ("delivered", 1), ("dead-lettered", 1),
        ("requeued", 0), ("delivered", 1), ("acked", 1),
    ]  # fmt: skip
    assert events[4].detail == "attempt 2 of 2: ValueError: order 42 is locked"
    assert events[5].detail == "from the dead letters"
    assert events[7].detail == "not worth a retry"


def test_released_throttled_and_leases_that_ran_out(make_queue: Make) -> None:
    q = make_queue(
        "lease", history=60, visibility_timeout=0.2, max_attempts=2,
        retry_backoff=Backoff(base=0.05, max=0.1), fetch_ahead=0,
    )  # fmt: skip
    task_id = q.offer("x", 0)
    task = q.poll(timeout=5)
    assert task is not None
    task.release()
    task = q.poll(timeout=5)
    assert task is not None
    task.throttle(0.05)
    task = q.poll(timeout=5)
    assert task is not None  # then its lease runs out twice: retried, then dead-lettered
    again = wait_until(lambda: q.poll(timeout=0.2))
    assert again.attempts == 2

    def buried() -> bool:
        q.poll(timeout=0.05)  # a fetch reclaims the lease that ran out
        info = q.get(task_id)
        return info is not None and info.state is TaskState.DEAD

    wait_until(buried)
    events = q.history(task_id)
    got = [(e.kind, e.attempt, e.detail) for e in events]
    assert got[0][0] == "offered"
    assert got[2] == ("released", 0, "")
    assert got[4] == ("throttled", 0, "rate limited, again in 50ms")
    assert ("retried", 1, "lease expired on attempt 1") in got
    assert got[-1] == ("dead-lettered", 2, "lease expired on attempt 2")
    assert [k for k, _, _ in got].count("delivered") == 4


def test_ttl_expiry_and_purge_end_a_task(make_queue: Make) -> None:
    q = make_queue("ttl", history=60)
    lapsed = q.offer("late", at=time.time() - 10, ttl=1)  # past its ttl when offered
    assert q.poll(timeout=0) is None  # the fetch drops it
    assert kinds(q, lapsed) == ["offered", "expired"]
    info = q.get(lapsed)
    assert info is not None and info.outcome == "expired"
    assert q.history(lapsed)[-1].detail == "its ttl ran out before a delivery"
    purged = q.offer("soon gone", 600)
    assert q.purge(["delayed"]) == 1
    assert kinds(q, purged) == ["offered", "purged"]
    assert q.get(purged).state is TaskState.CANCELLED  # type: ignore[union-attr]


def test_at_most_once_a_delivery_ends_the_task(make_queue: Make, client: redis.Redis) -> None:
    q = make_queue("amo", history=60, ack=False)
    task_id = q.offer("x", 0)
    assert q.poll(timeout=5) is not None
    assert kinds(q, task_id) == ["offered", "delivered"]
    info = q.get(task_id)
    assert info is not None and info.state is TaskState.DONE and info.outcome == "delivered"
    assert 0 < client.pttl(history_key(q, task_id)) <= 60_000


@pytest.mark.parametrize("ack", [True, False])
def test_an_undecodable_task_is_dead_lettered_in_its_history(
    make_queue: Make, client: redis.Redis, ack: bool
) -> None:
    q = make_queue(f"bad-{ack}", history=60, ack=ack)
    task_id = q.offer({"fine": True}, 0)
    client.hset(q.keys.key("tasks"), task_id, b"\xffnot an envelope")
    assert q.poll(timeout=0.5) is None  # buried, not handed out
    events = q.history(task_id)
    assert [e.kind for e in events] == ["offered", "delivered", "dead-lettered"]
    assert events[-1].detail.startswith("undecodable: ")
    assert client.pttl(history_key(q, task_id)) == -1  # dead letters live (at-most-once too)
    assert q.get(task_id).state is TaskState.DEAD  # type: ignore[union-attr]


def test_schedule_fires_and_batches_are_recorded(make_queue: Make) -> None:
    q = make_queue("cron", history=60)
    q.schedules.upsert("nightly", {"job": 1}, every=3600)
    fired = q.schedules.trigger("nightly")
    assert fired is not None
    assert q.history(fired)[0].detail.startswith("by schedule nightly, due ")
    ids = q.offer_many([("a", 0), Offer("b", 60, priority=3), Offer("c", 0, key="k")])
    for task_id in ids:
        assert kinds(q, task_id) == ["offered"]


def test_outbox_rows_are_recorded_as_the_relay_applies_them(
    make_queue: Make, outbox: Outbox, pg_dsn: str, table: str, redis_url: str
) -> None:
    q = make_queue("orders", history=60)
    q.history_settings()  # first use: the settings are in Redis before the relay writes
    relay = Relay(pg_dsn, redis_url, table=table)
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        plain = outbox.offer(conn, "orders", {"order": 1}, 0)
        keyed = outbox.offer(conn, "orders", {"order": 2}, 60, key="close:2")
    assert relay.relay_pending() == 2
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.reschedule(conn, "orders", keyed, 120)
    assert relay.relay_pending() == 1  # each its own step: a later row may fold earlier ones
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        outbox.cancel(conn, "orders", keyed)
    assert relay.relay_pending() == 1
    assert q.history(plain)[0].detail == f"by {origin()}, due now"  # the relay's process
    assert kinds(q, keyed) == ["offered", "rescheduled", "cancelled"]


def test_tasks_moved_from_redisson_start_their_history(
    make_queue: Make, client: redis.Redis, redis_url: str, prefix: str
) -> None:
    name = f"rdq-{prefix}"  # Redisson's keys carry no prefix: the test's own name
    java = RedissonClient(client, name)
    java.offer(b"order-1", 60_000)
    q = make_queue(name, history=60)
    q.history_settings()
    with Migration(name, name, redis_url, prefix=prefix) as migration:
        assert migration.run().counts.moved == 1
    (task,) = q.tasks("delayed")
    (event,) = q.history(task.id)
    assert event.kind == "offered" and event.detail.startswith("moved from Redisson, due in ")


def test_odd_ids_have_histories_too(make_queue: Make) -> None:
    q = make_queue("odd", history=60)
    for task_id in ("a|b|c", "订单:42", "x" * 256, "  spaced  "):
        q.offer("x", 0, id=task_id)
        task = q.poll(timeout=5)
        assert task is not None and task.id == task_id
        task.ack()
        assert kinds(q, task_id) == ["offered", "delivered", "acked"]
        assert q.get(task_id).state is TaskState.DONE  # type: ignore[union-attr]


# -- retention and bounds ------------------------------------------------------------------------


def test_a_history_lives_with_its_task_and_the_retention_after(
    make_queue: Make, client: redis.Redis
) -> None:
    q = make_queue("ret", history=1.5, max_attempts=1)
    done, dead = q.offer("ok", 0), q.offer("bad", 0)
    for task in q.poll_many(2, timeout=5):
        assert client.pttl(history_key(q, task.id)) == -1  # a live task's: no expiry
        if task.id == done:
            task.ack()
        else:
            task.retry(0, error="boom")
    assert client.pttl(history_key(q, dead)) == -1  # dead letters live: so does theirs
    ttl = client.pttl(history_key(q, done))
    assert 0 < ttl <= 1500
    wait_until(lambda: not client.exists(history_key(q, done)), timeout=10)
    assert q.history(done) == [] and q.get(done) is None
    assert kinds(q, dead) == ["offered", "delivered", "dead-lettered"]


def test_an_id_offered_again_continues_and_lives_again(
    make_queue: Make, client: redis.Redis
) -> None:
    q = make_queue("again", history=60)
    q.offer("first", 0, id="order-1")
    q.poll(timeout=5).ack()  # type: ignore[union-attr]
    assert client.pttl(history_key(q, "order-1")) > 0
    q.offer("second", 600, id="order-1")
    assert client.pttl(history_key(q, "order-1")) == -1  # a task again: kept while it lives
    assert kinds(q, "order-1") == ["offered", "delivered", "acked", "offered"]
    assert q.get("order-1").state is TaskState.DELAYED  # type: ignore[union-attr]


def test_events_per_task_and_bytes_per_detail_are_bounded(make_queue: Make) -> None:
    q = make_queue("bounded", history=HistorySettings.of(60, 5, 40), max_attempts=50)
    task_id = q.offer("x", 0)
    for n in range(12):
        task = q.poll(timeout=5)
        assert task is not None
        task.retry(0, error=f"RuntimeError: failure {n}")
    task = q.poll(timeout=5)
    assert task is not None
    task.retry(0, error="ValueError: " + "é" * 100)  # two bytes each: cut at a character
    events = q.history(task_id)
    assert len(events) == 5
    assert events[0].kind == "offered"  # the first is kept, and the latest
    assert events[1].kind == "trimmed" and events[1].detail.startswith("23 events dropped")
    assert [e.kind for e in events[2:]] == ["retried", "delivered", "retried"]
    assert events[2].detail == "RuntimeError: failure 11"
    long = events[-1].detail
    assert len(long.encode()) <= 40 and long.endswith("…") and long.startswith("ValueError: éé")
    assert [e.at for e in events] == sorted(e.at for e in events)


def test_lowering_max_events_trims_a_long_history_at_its_next_event(make_queue: Make) -> None:
    q = make_queue("lowered", history=HistorySettings.of(60, 100), max_attempts=50)
    task_id = q.offer("x", 0)
    for n in range(20):
        task = q.poll(timeout=5)
        assert task is not None
        task.retry(0, error=f"RuntimeError: failure {n}")
    assert len(q.history(task_id)) == 41
    q.enable_history(60, max_events=4)
    task = q.poll(timeout=5)
    assert task is not None
    task.ack()
    events = q.history(task_id)
    assert [e.kind for e in events] == ["offered", "trimmed", "delivered", "acked"]
    assert events[1].detail.startswith("40 events dropped")  # of the 43: the offer, the last 2


# -- the setting lives in Redis -----------------------------------------------------------------


def test_every_client_records_once_one_turned_it_on(redis_url: str, prefix: str) -> None:
    with (
        DelayQueue("shared", redis_url, prefix=prefix) as producer,
        DelayQueue("shared", redis_url, prefix=prefix) as worker,
        DelayQueue("shared", redis_url, prefix=prefix) as admin,
    ):
        before = producer.offer("unrecorded", 0)  # plain offers: the short script
        assert admin.history_settings() is None
        settings = admin.enable_history(timedelta(hours=2), max_events=10)
        assert settings == HistorySettings.of(7200, 10) == producer.history_settings()
        after = producer.offer("recorded", 0)
        keyed = producer.offer("recorded", 0, key="k1")
        got = {t.id: t for t in worker.poll_many(10, timeout=5)}
        assert set(got) == {before, after, keyed}
        for task in got.values():
            task.ack()
        assert kinds(admin, before) == ["delivered", "acked"]  # recorded from then on
        assert kinds(admin, after) == ["offered", "delivered", "acked"]
        assert kinds(admin, keyed) == ["offered", "delivered", "acked"]
        assert admin.disable_history() is True
        assert admin.disable_history() is False
        late = producer.offer("off again", 0)  # its shard still routes via offer.lua: fine
        worker.poll(timeout=5).ack()  # type: ignore[union-attr]
        assert admin.history(late) == [] and admin.get(late) is None
        assert kinds(admin, after) == ["offered", "delivered", "acked"]  # ended: kept


def test_history_false_turns_it_off_and_deletes_live_histories(
    make_queue: Make, client: redis.Redis, prefix: str
) -> None:
    on = make_queue("toggle", history=True)
    assert on.history_settings() == HistorySettings()
    ended = on.offer("x", 0)
    on.poll(timeout=5).ack()  # type: ignore[union-attr]
    waiting = on.offer_many([(i, 600) for i in range(450)])  # more than one sweep page
    assert len(hist_keys(client, prefix)) == 452  # the settings and 451 histories
    off = make_queue("toggle", history=False)
    assert off.history_settings() is None  # at first use, as create=True registers
    assert hist_keys(client, prefix) == [history_key(on, ended).encode()]
    assert off.history(waiting[0]) == []
    assert b"hist" not in client.hgetall(f"{prefix}:{{toggle}}:counters")
    assert kinds(off, ended) == ["offered", "delivered", "acked"]


def test_bad_settings_fail_before_anything_is_written(make_queue: Make) -> None:
    with pytest.raises(ConfigError, match="more than 30 days"):
        make_queue("bad", history=timedelta(days=90))
    q = make_queue("bad")
    for kwargs in ({"max_events": 1}, {"max_detail_bytes": 10**6}, {"retention": 0}):
        with pytest.raises(ConfigError):
            q.enable_history(**kwargs)  # type: ignore[arg-type]
    assert q.history_settings() is None
    for gone in ("done", "cancelled"):  # ended tasks are not in the queue to list or purge
        with pytest.raises(ConfigError, match="one of delayed, ready, inflight, expired, dead"):
            q.tasks(gone)
        with pytest.raises(ConfigError, match="among delayed, ready"):
            q.purge([gone])


# -- off costs nothing ---------------------------------------------------------------------------


@pytest.fixture
def private_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(BINARIES[0][1]).start()  # alone on it: its commands are ours
    yield server
    server.stop()


def _workload(q: DelayQueue) -> None:
    """Every operation that records an event when history is on."""
    ids = [q.offer("plain", 0), q.offer("keyed", 0, key="k", ttl=60), q.offer("later", 600)]
    q.offer_many([("bulk", 0), ("bulk", 0)])
    q.reschedule(ids[2], 900)
    task = q.poll(timeout=5)
    assert task is not None
    task.extend(10)
    task.retry(0, error=TRACEBACK)
    for task in q.poll_many(10, timeout=5):
        if task.payload == "bulk":
            task.reject("bad")
        else:
            task.ack()
    q.requeue_dead()
    q.cancel(ids[2])
    q.purge(["ready", "delayed", "dead"])
    q.get(ids[0])
    q.history(ids[0])


def test_with_history_off_no_command_touches_a_history_key(
    private_server: EmbeddedRedis, prefix: str
) -> None:
    """MONITOR shows every command the scripts run: with history off the only ones naming a
    history key are flow_probe's EXISTS (which tells flow control and history apart at once)
    and the plain scripts' one EXISTS, and the get() of a task no queue holds (one LRANGE, on
    that miss only)."""
    client = redis.Redis.from_url(private_server.url)
    seen: list[str] = []
    ready = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            for entry in monitor.listen():
                seen.append(entry["command"])
                if "STOP-WATCHING" in entry["command"]:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    with DelayQueue("quiet", private_server.url, prefix=prefix, max_attempts=1, fetch_ahead=0) as q:
        _workload(q)
    client.echo("STOP-WATCHING")
    watcher.join(10)
    # A plain fetch's or ack's call itself names the feature keys (hist among them) for the
    # script's one EXISTS: the call, not a command run on a history key.
    touching = [c for c in seen if ":hist" in c and c.split()[0].upper() != "EVALSHA"]
    assert touching, "the workload ran no script?"
    for command in touching:
        verb = command.split()[0].upper()
        assert verb == "EXISTS" or (verb == "LRANGE" and command.count(":hist:") == 1), command
    assert hist_keys(client, prefix) == []
    assert b"hist" not in client.hgetall(f"{prefix}:{{quiet}}:counters")
    client.close()  # its monitor's connection is back in its pool, in a cycle gc finds late


def test_commands_per_call_with_history_on_and_off(
    private_server: EmbeddedRedis, prefix: str
) -> None:
    """The same workload on a queue without and with history: the same script calls, and
    with history the extra commands are the events' writes (and one read of the settings
    per script that records)."""
    client = redis.Redis.from_url(private_server.url)

    def counts(name: str, **options: Any) -> tuple[int, int]:
        client.config_resetstat()
        url = private_server.url
        with DelayQueue(name, url, prefix=prefix, max_attempts=1, fetch_ahead=0, **options) as q:
            if "history" in options:
                q.history_settings()  # the settings are written at first use
                client.config_resetstat()
            _workload(q)
        stats = client.info("commandstats")
        scripts = stats["cmdstat_evalsha"]["calls"]
        total = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_evalsha")
        return scripts, total

    counts("warm-up")  # loads the scripts (a NOSCRIPT reply counts as a call)...
    counts("warm-up-on", history=60)  # ...and the full fetch and ack
    off_scripts, off_commands = counts("off")
    on_scripts, on_commands = counts("on", history=60)
    # With history on, plain offers ask offer_one first, then offer.lua, and the first plain
    # fetch is refused, then sent full: one script call more each (the shard remembers).
    assert on_scripts == off_scripts + 2
    assert on_commands > off_commands


# -- layouts -------------------------------------------------------------------------------------


def test_a_sharded_queue_keeps_each_history_on_its_shard(
    make_queue: Make, client: redis.Redis, prefix: str
) -> None:
    q = make_queue("big", shards=4, history=60)
    ids = q.offer_many([(i, 0) for i in range(40)])
    got = []
    while len(got) < 40:
        batch = q.poll_many(40, timeout=5)
        assert batch, f"only {len(got)} came"
        for task in batch:
            task.ack()
        got += batch
    shards = {task.id: task._shard.name for task in got}  # type: ignore[union-attr]
    assert len(set(shards.values())) == 4
    for task_id in ids:
        assert kinds(q, task_id) == ["offered", "delivered", "acked"]
        assert client.exists(history_key(q, task_id, shards[task_id]))
        assert q.get(task_id).state is TaskState.DONE  # type: ignore[union-attr]
    assert q.disable_history()
    for shard in q._routes().every:
        assert shard.history_settings(["get"]) is None


def test_a_reshard_carries_the_settings(make_queue: Make, redis_url: str, prefix: str) -> None:
    q = make_queue("moving", history=HistorySettings.of(120, 7, 64), safety_interval=0.2)
    first = q.offer("before", 0)
    reshard("moving", redis_url, shards=3, prefix=prefix)
    wait_until(lambda: q._routes(again=True).previous)
    for shard in q._routes().current:
        assert shard.history_settings(["get"]) == HistorySettings.of(120, 7, 64)
    later = q.offer_many([(i, 0) for i in range(9)])
    handled = 0
    while handled < 10:
        batch = q.poll_many(10, timeout=5)
        assert batch
        for task in batch:
            task.ack()
        handled += len(batch)
    for task_id in [first, *later]:  # the previous layout's shard is searched too
        assert kinds(q, task_id) == ["offered", "delivered", "acked"]
    finish_reshard("moving", redis_url, prefix=prefix, grace=0)
    q._routes(again=True)
    for task_id in later:
        assert kinds(q, task_id) == ["offered", "delivered", "acked"]
    # The retired layout's histories expire there, out of the queue's reach (docs/history.md).
    assert q.history(first) == []


async def test_the_async_queue_has_the_same_history(make_async_queue: Any) -> None:
    q: AsyncDelayQueue = make_async_queue("aq")
    assert await q.history_settings() is None
    await q.enable_history(30)
    task_id = await q.offer("x", 0)
    task = await q.poll(timeout=5)
    assert task is not None
    await task.ack()
    assert [e.kind for e in await q.history(task_id)] == ["offered", "delivered", "acked"]
    info = await q.get(task_id)
    assert info is not None and info.state is TaskState.DONE
    assert await q.disable_history() is True
