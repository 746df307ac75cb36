"""delayq and Redisson's RDelayedQueue on one Redis (7, 6.2 and Valkey 8: the redis_server
fixture), against the emulation of Redisson's client in tests/redisson_emulation.py: Python
offers that Java takes, Java offers that delayq takes after a migration, in both member
formats and both codecs; none lost, none doubled, due times kept."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq import ConfigError, DelayQueue
from delayq._core.redisson import CLASS_HEADER, MemberFormat, RedissonKeys
from delayq._core.redisson_moves import Source
from delayq._core.scripts import Op
from delayq.embedded import EmbeddedRedis
from delayq.redisson import Migration, RedissonDelayedQueue
from tests.helpers import wait_until
from tests.redisson_emulation import RedissonClient

CODECS = ["string", "json-jackson"]


@pytest.fixture
def name(prefix: str) -> Iterator[str]:
    """A Redisson queue name of this test's own (Redisson's keys carry no prefix)."""
    yield f"orders-{prefix}"


def java_value(codec: str, i: int) -> tuple[bytes, Any]:
    """What a Java producer stores for task i, and the payload delayq should hand over."""
    if codec == "string":
        return f"order-{i}".encode(), f"order-{i}"
    body = {"@class": "com.shop.OrderTimeout", "orderId": 2**60 + i, "note": "ü"}
    return json.dumps(body).encode(), {"orderId": 2**60 + i, "note": "ü"}


def drain(queue: DelayQueue, expected: int, timeout: float = 20.0) -> list[Any]:
    """Take and ack tasks until ``expected`` came (then make sure no more come)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        task = queue.poll(timeout=1)
        if task is not None:
            got.append(task)
            task.ack()
    assert queue.poll(timeout=0.2) is None, "a task came twice or from nowhere"
    return got


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- delayq -> Java: RedissonDelayedQueue.offer writes what Redisson's offer writes ----------


@pytest.mark.parametrize("fmt", list(MemberFormat))
@pytest.mark.parametrize("codec", CODECS)
def test_python_offers_are_taken_by_java(
    redis_url: str, client: redis.Redis, name: str, fmt: MemberFormat, codec: str
) -> None:
    java = RedissonClient(client, name, fmt)
    values = ["a", "ü-2", ""] if codec == "string" else [{"orderId": 2**60}, [1, "x"], "s"]
    with RedissonDelayedQueue(name, redis_url, codec=codec, member_format=fmt.value) as py:
        offered_at = time.time() * 1000
        for i, value in enumerate(values):
            java_class = "com.shop.T" if isinstance(value, dict) else None
            py.offer(value, 0.3 + i * 0.05, java_class=java_class)
    keys = RedissonKeys(name)
    assert client.zcard(keys.timeouts) == client.llen(keys.members) == len(values)
    # what Redisson's own transfer script (Lua's struct.unpack) finds: nothing due yet
    assert java.transfer() is not None and client.llen(keys.destination) == 0
    taken = []
    deadline = time.monotonic() + 10
    while len(taken) < len(values) and time.monotonic() < deadline:
        java.transfer()
        got = java.take(timeout_s=0.05)
        if got is not None:
            taken.append((got, time.time() * 1000))
    assert [raw for raw, _ in taken] == [
        v.encode() if codec == "string" else _jackson(v) for v in values
    ]
    for i, (_, at) in enumerate(taken):
        assert at >= offered_at + 300 + i * 50 - 5  # not early (both clocks are this host's)
    assert client.zcard(keys.timeouts) == client.llen(keys.members) == 0


def _jackson(value: Any) -> bytes:
    if isinstance(value, dict):
        value = {"@class": "com.shop.T", **value}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_python_offer_is_announced_and_safe_to_resend(
    redis_url: str, client: redis.Redis, name: str
) -> None:
    keys = RedissonKeys(name)
    pubsub = client.pubsub()
    pubsub.subscribe(keys.channel)
    wait_until(lambda: pubsub.get_message(timeout=0.1))  # the subscribe confirmation
    with RedissonDelayedQueue(name, redis_url) as py:
        py.offer("first", 60)
        message = wait_until(lambda: pubsub.get_message(timeout=0.1))
        assert abs(int(message["data"]) - (time.time() * 1000 + 60_000)) < 5000
        py.offer("later", 120)  # not the new head: Redisson announces only a new head
        assert pubsub.get_message(timeout=0.3) is None
        member = client.zrange(keys.timeouts, 0, 0)[0]
        # a resent call (same member) adds nothing, where Redisson's script pushes it twice
        py._runner.run(  # the call a retry sends again
            Op.REDISSON_OFFER,
            (keys.destination, keys.timeouts, keys.members, keys.channel),
            (1, member),
        )
    pubsub.close()
    assert client.zcard(keys.timeouts) == client.llen(keys.members) == 2


def test_producer_refuses_what_redisson_cannot_store(redis_url: str, name: str) -> None:
    with pytest.raises(ConfigError, match="member_format"):
        RedissonDelayedQueue(name, redis_url, member_format="3.0")
    with pytest.raises(ConfigError, match="codec"):
        RedissonDelayedQueue(name, redis_url, codec="fst")
    with RedissonDelayedQueue(name, redis_url) as py:
        with pytest.raises(TypeError):
            py.offer(42, 1)
        with pytest.raises(ValueError, match="delay"):
            py.offer("x", -1)


# -- Java -> delayq: the migration ----------------------------------------------------------


@pytest.mark.parametrize("path", ["atomic", "claims"])
@pytest.mark.parametrize("fmt", list(MemberFormat))
@pytest.mark.parametrize("codec", CODECS)
def test_java_offers_migrate_with_due_times_kept(
    redis_url: str,
    client: redis.Redis,
    make_queue: Callable[..., DelayQueue],
    prefix: str,
    name: str,
    fmt: MemberFormat,
    codec: str,
    path: str,
) -> None:
    java = RedissonClient(client, name, fmt)
    count = 250  # three batches
    expected = {}
    for i in range(count):
        raw, payload = java_value(codec, i)
        java.offer(raw, 400 + (i * 7) % 600)
        expected[json.dumps(payload)] = payload
    scores = {
        m: int(s) for m, s in client.zrange(RedissonKeys(name).timeouts, 0, -1, withscores=True)
    }
    with Migration(name, name, redis_url, codec=codec, prefix=prefix, path=path) as migration:
        summary = migration.run()
    assert summary.counts.moved == count and summary.counts.dead_lettered == 0
    assert summary.after.empty and summary.counts.by_format == {fmt.value: count}
    queue = make_queue(name)
    stats = queue.stats()  # some may be due already on a slow machine
    assert stats.delayed + stats.ready == count
    got = drain(queue, count)
    assert sorted(json.dumps(t.payload) for t in got) == sorted(expected)
    due_by_id = {f"rdq-{m[1:9].hex()}" if fmt is MemberFormat.CURRENT else None: s
                 for m, s in scores.items()}  # fmt: skip
    for task in got:
        assert task.delivered_ms >= task.due_ms  # never early
        if fmt is MemberFormat.CURRENT:
            assert task.due_ms == due_by_id[task.id]  # Redisson's due time, kept to the ms
        if codec == "json-jackson":
            info = queue.get(task.id)
            assert info is None  # acked
    assert sorted(t.due_ms for t in got) == sorted(scores.values())


def test_jackson_class_is_kept_as_a_header_or_dropped(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    java = RedissonClient(client, name)
    java.offer(b'{"@class":"com.shop.OrderTimeout","orderId":7}', 60_000)
    with Migration(name, name, redis_url, codec="json-jackson", prefix=prefix) as migration:
        migration.run()
    queue = make_queue(name)
    (info,) = queue.tasks("delayed")
    assert info.payload == {"orderId": 7} and info.headers == {
        CLASS_HEADER: "com.shop.OrderTimeout"
    }
    java.offer(b'{"@class":"com.shop.OrderTimeout","orderId":8}', 60_000)
    with Migration(
        name, name, redis_url, codec="json-jackson", prefix=prefix, keep_class=False
    ) as migration:
        migration.run()
    infos = sorted(queue.tasks("delayed"), key=lambda i: i.payload["orderId"])
    assert infos[1].payload == {"orderId": 8} and infos[1].headers == {}


def test_the_ready_list_moves_due_now_in_order(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    java = RedissonClient(client, name)
    for i in range(150):
        java.offer(f"due-{i}".encode(), 0)
    java.offer(b"same", 0)
    java.offer(b"same", 0)
    wait_until(lambda: java.transfer() is None and client.llen(name) == 152)
    with Migration(name, name, redis_url, prefix=prefix) as migration:
        summary = migration.run()
    assert summary.before.ready == 152 and summary.counts.by_format == {"ready list": 152}
    assert client.llen(name) == 0
    got = drain(make_queue(name), 152)
    payloads = [t.payload for t in got]
    assert sorted(payloads) == sorted([f"due-{i}" for i in range(150)] + ["same", "same"])
    assert all(t.due_ms <= t.delivered_ms for t in got)


def test_undecodable_members_are_dead_lettered_with_their_bytes(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    keys = RedissonKeys(name)
    java = RedissonClient(client, name)
    java.offer(b"good", 100)
    java.offer(b"\xff\xfe not utf-8", 100)  # a fine member whose value StringCodec cannot read
    bad = b"\x07does not unpack"  # neither 'Bc0Lc0' nor 'dLc0'
    client.zadd(keys.timeouts, {bad: 1})
    client.rpush(keys.members, bad)
    # the member that does not unpack is why Redisson's own timer fails for ever (#5595)
    with pytest.raises(redis.ResponseError, match="unpack"):
        java.transfer()
    with Migration(name, name, redis_url, prefix=prefix) as migration:
        backlog, counts, _ = migration.preview()
        assert counts.dead_lettered == 2 and backlog.pending == 3
        summary = migration.run()
    assert summary.counts.moved == 1 and summary.counts.dead_lettered == 2
    assert summary.after.empty
    queue = make_queue(name)
    dead = {d.id: d for d in queue.dead()}
    assert len(dead) == 2
    raws = sorted(base64.b64decode(d.payload["raw_base64"]) for d in dead.values())
    assert bad in raws and any(r.endswith(b"\xff\xfe not utf-8") for r in raws)
    assert all("not migrated" in (d.error or "") for d in dead.values())
    assert [t.payload for t in drain(queue, 1)] == ["good"]


def test_a_redisson_timer_racing_the_migration_delivers_each_once(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    """Java services still run during the move: their timers move due members to the ready
    list, their consumers take them, and the migration takes the rest. Each value is
    delivered once, by one side or the other."""
    java = RedissonClient(client, name)
    count = 600
    for i in range(count):
        java.offer(f"t{i}".encode(), i % 300)  # due within 0.3 s: the timer races us
    java.start_timer()
    java_took: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        own = RedissonClient(redis.Redis.from_url(redis_url), name)
        while not stop.is_set():
            got = own.take(timeout_s=0.1)
            if got is not None:
                java_took.append(got)
        own.client.close()

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        with Migration(name, name, redis_url, prefix=prefix, batch=50) as migration:
            summary = migration.run()
    finally:
        java.stop_timer()
        # the Java consumer takes what the Java timer moved before it stopped
        wait_until(lambda: client.llen(name) == 0, timeout=10)
        stop.set()
        consumer.join(5)
    got = drain(make_queue(name), summary.counts.moved)
    delivered = [t.payload for t in got] + [raw.decode() for raw in java_took]
    assert sorted(delivered) == sorted(f"t{i}" for i in range(count))


def test_follow_moves_what_java_keeps_offering(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    java = RedissonClient(client, name)
    for i in range(100):
        java.offer(f"before-{i}".encode(), 60_000)
    offered = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            producer = RedissonClient(redis.Redis.from_url(redis_url), name)
            for i in range(200):
                producer.offer(f"during-{i}".encode(), 60_000 + i)
                time.sleep(0.005)
            producer.client.close()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        offered.set()

    with Migration(name, name, redis_url, prefix=prefix, safety_interval=30) as migration:
        producer = threading.Thread(target=produce)
        producer.start()
        summary = migration.run(
            follow=True,
            stop=lambda: offered.is_set() and migration.counts.moved >= 300,
        )
        producer.join()
    assert not errors
    assert summary.counts.moved == 300 and summary.after.empty
    queue = make_queue(name)
    assert queue.stats().delayed == 300  # all due a minute out: nothing changes state here
    moved = [i.payload for i in queue.tasks("delayed", limit=500)]
    assert sorted(moved) == sorted(
        [f"before-{i}" for i in range(100)] + [f"during-{i}" for i in range(200)]
    )
    # the offers made while following were moved as they came: woken by Redisson's channel
    # (the safety interval is 30 s, longer than the test)
    assert summary.elapsed_s < 20


def test_a_claimed_batch_lands_once_after_a_crash(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    """A cross-slot move killed between its steps: after the claim (nothing landed yet), and
    after the land (the claim not yet released). The next run finishes each once."""
    java = RedissonClient(client, name)
    for i in range(30):
        java.offer(f"c{i}".encode(), 60_000)
    keys = RedissonKeys(name)
    crashed = Migration(name, name, redis_url, prefix=prefix, path="claims", batch=10)
    crashed.path()
    raws = client.lrange(keys.members, 0, 9)
    blob = crashed._runner.run(  # step 1 of 3, then the crash
        Op.REDISSON_CLAIM,
        (*keys.all, keys.claims),
        ["p", "first", *raws],
    )
    assert len(raws) == 10 and client.hlen(keys.claims) == 1 and blob
    second = client.lrange(keys.members, 0, 9)
    real_release = crashed._runner.run

    def no_release(op: Any, keys_: Any, args: Any) -> Any:
        if op.value == "redisson_release":
            raise SystemExit("killed")
        return real_release(op, keys_, args)

    crashed._runner.run = no_release  # type: ignore[method-assign]
    with pytest.raises(SystemExit):  # the real steps 1 and 2, killed before step 3
        crashed._claim_and_land(
            Source.PENDING, "second", [crashed._decoding.pending(r) for r in second]
        )
    crashed._runner.run = real_release  # type: ignore[method-assign]
    crashed.close()
    assert client.hlen(keys.claims) == 2  # both batches still claimed
    queue = make_queue(name)
    assert queue.stats().delayed == 10  # the second batch landed, the first did not
    with Migration(name, name, redis_url, prefix=prefix, path="claims") as migration:
        summary = migration.run()
    assert client.hlen(keys.claims) == 0 and summary.after.empty
    infos = queue.tasks("delayed")
    assert sorted(i.payload for i in infos) == sorted(f"c{i}" for i in range(30))
    assert client.keys(f"{prefix}:*redisson:*") == []  # receipts deleted once released


def test_a_sharded_target_is_refused(
    redis_url: str, make_queue: Callable[..., DelayQueue], prefix: str, name: str
) -> None:
    queue = make_queue(name, shards=2)
    queue.offer("x", delay=60)
    with (
        Migration(name, name, redis_url, prefix=prefix) as migration,
        pytest.raises(ConfigError, match="sharded"),
    ):
        migration.run()


def test_options_are_checked_up_front(redis_server: EmbeddedRedis, name: str) -> None:
    for bad in ({"batch": 0}, {"path": "teleport"}, {"queue_codec": "pickle"}, {"codec": "x"}):
        with pytest.raises(ConfigError):
            Migration(name, name, redis_server.url, **bad)


def test_every_redisson_script_survives_a_script_flush(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    java = RedissonClient(client, name)
    with RedissonDelayedQueue(name, redis_url) as py:
        client.script_flush()
        py.offer("offered", 60)  # redisson_offer
    java.offer(b"ready", 0)
    java.transfer()
    for path in ("atomic", "claims"):  # redisson_move; redisson_claim, _land, _release
        java.offer(path.encode(), 60_000)
        with Migration(name, name, redis_url, prefix=prefix, path=path) as migration:
            client.script_flush()
            assert migration.step() >= 1
            client.script_flush()
            migration.run()
    queue = make_queue(name)
    moved = [i.payload for state in ("delayed", "ready") for i in queue.tasks(state)]
    assert sorted(moved) == ["atomic", "claims", "offered", "ready"]


async def test_the_asyncio_front_end_offers_and_migrates(
    redis_url: str, client: redis.Redis, prefix: str, name: str
) -> None:
    from delayq import AsyncDelayQueue
    from delayq.redisson import AsyncMigration, AsyncRedissonDelayedQueue

    async with AsyncRedissonDelayedQueue(name, redis_url, codec="json-jackson") as py:
        for i in range(120):
            await py.offer({"orderId": i}, 0.2, java_class="com.shop.T")
    async with AsyncMigration(name, name, redis_url, codec="json-jackson", prefix=prefix) as m:
        backlog, counts, first = await m.preview(limit=2)
        assert backlog.pending == 120 and counts.by_format == {"3.21.1+": 120}
        assert len(first) == 2
        summary = await m.run()
    assert summary.counts.moved == 120
    queue = AsyncDelayQueue(name, redis_url, prefix=prefix)
    try:
        got = []
        while len(got) < 120:
            task = await queue.poll(timeout=5)
            assert task is not None
            assert task.headers == {CLASS_HEADER: "com.shop.T"}
            got.append(task.payload["orderId"])
            await task.ack()
        assert sorted(got) == list(range(120))
    finally:
        await queue.close()


def test_a_msgpack_queue_gets_msgpack_envelopes(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    java = RedissonClient(client, name)
    java.offer(b'{"@class":"com.shop.T","orderId":1}', 0)
    with Migration(
        name, name, redis_url, codec="json-jackson", prefix=prefix, queue_codec="msgpack"
    ) as migration:
        assert migration.run().counts.moved == 1
    (task,) = drain(make_queue(name, codec="msgpack"), 1)
    assert task.payload == {"orderId": 1} and task.headers == {CLASS_HEADER: "com.shop.T"}


def test_a_claim_landed_again_without_its_receipt_writes_nothing_twice(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    """Past the receipt's lifetime the ids still guard: a task that is still in delayq keeps
    its id (derived from the member), so landing its claim again finds the id taken."""
    java = RedissonClient(client, name)
    for i in range(5):
        java.offer(b"r%d" % i, 60_000)
    keys = RedissonKeys(name)
    crashed = Migration(name, name, redis_url, prefix=prefix, path="claims")
    real_run = crashed._runner.run

    def lose_the_release(op: Any, keys_: Any, args: Any) -> Any:
        if op is Op.REDISSON_RELEASE:
            client.delete(*client.keys(f"{prefix}:*redisson:*"))  # the receipt ran out
            raise SystemExit("killed")
        return real_run(op, keys_, args)

    crashed._runner.run = lose_the_release  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        crashed.run()
    crashed._runner.run = real_run  # type: ignore[method-assign]
    crashed.close()
    assert client.hlen(keys.claims) == 1
    with Migration(name, name, redis_url, prefix=prefix, path="claims") as migration:
        summary = migration.run()
    assert summary.counts.conflicts == 5 and summary.counts.moved == 0
    assert client.hlen(keys.claims) == 0
    queue = make_queue(name)
    assert sorted(i.payload for i in queue.tasks("delayed")) == [f"r{i}" for i in range(5)]


def test_both_member_formats_in_one_queue_migrate_together(
    redis_url: str, client: redis.Redis, make_queue: Callable[..., DelayQueue], prefix: str,
    name: str,
) -> None:  # fmt: skip
    """A queue offered to by Redisson before and after 3.21.1: its own timer fails on the
    old members for ever (#5595); the migration moves both."""
    # The old member is due first, as it would be after an upgrade: offered in one millisecond,
    # the two sort by their random bytes, and the timer may move "new" before it fails.
    RedissonClient(client, name, MemberFormat.LEGACY).offer(b"old", -1000)
    current = RedissonClient(client, name)
    current.offer(b"new", 0)
    with pytest.raises(redis.ResponseError, match="unpack"):
        current.transfer()
    with Migration(name, name, redis_url, prefix=prefix) as migration:
        summary = migration.run()
    assert summary.counts.by_format == {"pre-3.21.1": 1, "3.21.1+": 1}
    assert sorted(t.payload for t in drain(make_queue(name), 2)) == ["new", "old"]
