"""Durable offers: WAIT (or WAITAOF) on the connection that made the write, shortfalls raised
with the task ids, and a clear error where the server cannot do what was asked."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from delayq import (
    AsyncDelayQueue,
    ConfigError,
    DelayQueue,
    Durability,
    Limit,
    NotDurable,
    Offer,
)
from delayq._core import sharding
from delayq._core.scripts import Op
from delayq.embedded import EmbeddedRedis, valkey_server

from ..conftest import BINARIES
from ..helpers import wait_until
from .test_review import DropReplyProxy


def _replica_of(master: EmbeddedRedis, binary: str, *extra: str) -> EmbeddedRedis:
    replica = EmbeddedRedis(
        binary, extra_args=["--replicaof", "127.0.0.1", str(master.port), *extra]
    )
    replica.start()
    client = redis.Redis(port=replica.port)
    wait_until(lambda: client.info("replication").get("master_link_status") == "up", timeout=15)
    client.close()
    return replica


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    binary = BINARIES[0][1]
    master = EmbeddedRedis(binary).start()
    replica = _replica_of(master, binary)
    yield master, replica
    replica.stop()
    master.stop()


def test_durability_options_are_checked() -> None:
    for bad in (
        {"replicas": -1},
        {"replicas": 0},  # and no aof: waits for nothing
        {"replicas": True},
        {"timeout": 0},
        {"timeout": float("nan")},
        {"timeout": 120},
        {"on_shortfall": "ignore"},
    ):
        with pytest.raises(ConfigError):
            Durability(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Durability"):
        DelayQueue("q", "redis://127.0.0.1:1/0", durability={"replicas": 1})  # type: ignore[arg-type]


def test_offers_and_acks_wait_for_the_replica(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=2.0, after_ack=True)
    with DelayQueue("durable", master.url, prefix=prefix, durability=durable) as q:
        one = q.offer("one", delay=0)
        many = q.offer_many([(n, 0) for n in range(2500)])  # several chunks, one WAIT
        keyed = q.offer("keyed", delay=60, key="k")
        on_replica = redis.Redis(port=replica.port)
        # WAIT returned, so the replica has every task already: no waiting here.
        assert on_replica.hexists(q.keys.key("tasks"), one)
        assert on_replica.hexists(q.keys.key("tasks"), many[-1])
        assert on_replica.hexists(q.keys.key("tasks"), keyed)
        task = q.poll(timeout=5)
        assert task is not None
        task.ack()
        assert not on_replica.hexists(q.keys.key("tasks"), task.id)
        on_replica.close()


def test_a_sharded_queue_waits_for_the_replica_on_every_shard(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=2.0, after_ack=True)
    with DelayQueue("durable-4", master.url, prefix=prefix, durability=durable, shards=4) as q:
        ids = q.offer_many([(n, 0) for n in range(40)])
        keyed = q.offer("keyed", delay=60, key="k")
        on_replica = redis.Redis(port=replica.port)
        try:
            held = sum(
                on_replica.hexists(f"{prefix}:{{{sub}}}:tasks", task_id)
                for task_id in [*ids, keyed]
                for sub in sharding.shard_names("durable-4", 4)
            )
            assert held == 41  # WAIT returned on each shard's connection: all there already
            tasks: list = []
            while len(tasks) < 40:  # a shard at a time
                batch = q.poll_many(40, timeout=5)
                assert batch, "every task comes back"
                tasks += batch
            assert all(q.ack_many(tasks))  # acks that wait for the replica, shard by shard
            assert q.stats().counters["acked"] == 40
        finally:
            on_replica.close()


async def test_async_offers_wait_for_the_replica(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    async with AsyncDelayQueue(
        "durable-async", master.url, prefix=prefix, durability=Durability(replicas=1)
    ) as q:
        task_id = await q.offer({"a": 1}, delay=60)
        on_replica = redis.Redis(port=replica.port)
        assert on_replica.hexists(q.keys.key("tasks"), task_id)
        on_replica.close()


def test_a_stalled_replica_makes_the_offer_raise_not_durable_with_its_ids(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=0.3)
    with DelayQueue("stall", master.url, prefix=prefix, durability=durable) as q:
        q.stats()
        assert replica._proc is not None
        os.kill(replica._proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(NotDurable, match="0 of 1 replicas") as caught:
                q.offer("unconfirmed", delay=60, id="order-1-close")
            assert time.monotonic() - started < 3
            assert caught.value.task_ids == ["order-1-close"]
            with pytest.raises(NotDurable) as bulk:
                q.offer_many([Offer(n, 60, id=f"bulk-{n}") for n in range(3)])
            assert bulk.value.task_ids == ["bulk-0", "bulk-1", "bulk-2"]
        finally:
            os.kill(replica._proc.pid, signal.SIGCONT)
        # The writes stand on the master; offering the same ids again is safe once the
        # replica is back, and confirms them.
        assert q.get("order-1-close") is not None
        again = q.offer("unconfirmed", delay=60, id="order-1-close")
        assert again == "order-1-close" and again.outcome == "existing"
        assert q.stats().delayed == 4


def test_cancels_and_reschedules_wait_for_the_replica(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    """A cancel or a reschedule that changed a task returns once the replica has it: a
    failover right after it cannot bring the cancelled task back (the order paid, its close
    task run anyway)."""
    master, replica = pair
    durable = Durability(replicas=1, timeout=2.0)
    with DelayQueue("durable-cancel", master.url, prefix=prefix, durability=durable) as q:
        q.offer_many([Offer("close", 60, id="order-1"), Offer("close", 60, id="order-2")])
        on_replica = redis.Redis(port=replica.port)
        try:
            assert q.cancel("order-1") is True
            assert not on_replica.hexists(q.keys.key("tasks"), "order-1")  # already there
            assert q.reschedule("order-2", 600) is True
            due = on_replica.zscore(q.keys.key("delayed"), "order-2")
            assert due is not None and due == redis.Redis(port=master.port).zscore(
                q.keys.key("delayed"), "order-2"
            )
        finally:
            on_replica.close()


def test_a_stalled_replica_makes_a_cancel_raise_not_durable(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    """Unconfirmed, a cancel that removed its task raises NotDurable (the task is gone from
    the master; a failover now could bring it back), and so does a cancel again: it finds
    no task, but its False would say the replicas have none waiting either. A reschedule
    that moved nothing returns False. Once the replica is back, cancelling again returns
    False: the first cancel is confirmed, on the replica."""
    master, replica = pair
    durable = Durability(replicas=1, timeout=0.3)
    with DelayQueue("stall-cancel", master.url, prefix=prefix) as plain:
        plain.offer_many([Offer("close", 60, id="order-1"), Offer("close", 60, id="order-2")])
    with DelayQueue("stall-cancel", master.url, prefix=prefix, durability=durable) as q:
        assert replica._proc is not None
        os.kill(replica._proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotDurable, match=r"cancelled .*but not confirmed") as caught:
                q.cancel("order-1")
            assert caught.value.task_ids == ["order-1"]
            with pytest.raises(NotDurable, match="rescheduled but not confirmed"):
                q.reschedule("order-2", 600)
            with pytest.raises(NotDurable, match="not waiting"):
                q.cancel("order-1")  # gone from the master: not yet known to the replica
            started = time.monotonic()
            assert q.reschedule("no-such-order", 5) is False
            assert time.monotonic() - started < 2  # it waited for nothing
        finally:
            os.kill(replica._proc.pid, signal.SIGCONT)
        assert q.cancel("order-1") is False  # confirmed: the replica has the first cancel
        on_replica = redis.Redis(port=replica.port)
        assert not on_replica.hexists(q.keys.key("tasks"), "order-1")
        on_replica.close()
        assert q.get("order-1") is None  # the cancel stands on the master
        info = q.get("order-2")
        assert info is not None and info.due_at.timestamp() > time.time() + 500


def test_on_shortfall_warn_logs_and_returns(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    master, _ = pair
    durable = Durability(replicas=2, timeout=0.2, on_shortfall="warn")  # only one replica
    with (
        caplog.at_level(logging.WARNING, logger="delayq"),
        DelayQueue("warn", master.url, prefix=prefix, durability=durable) as q,
    ):
        task_id = q.offer("x", delay=60)
        assert q.get(task_id) is not None
    assert any("1 of 2 replicas confirmed" in r.getMessage() for r in caplog.records)


def test_aof_durability_needs_waitaof(prefix: str) -> None:
    binary = BINARIES[0][1]
    with EmbeddedRedis(binary) as server:
        if server.version >= "7.2":
            pytest.skip("this server has WAITAOF")
        with (
            DelayQueue(
                "aof", server.url, prefix=prefix, durability=Durability(replicas=0, aof=True)
            ) as q,
            pytest.raises(ConfigError, match="WAITAOF"),
        ):
            q.offer("x", delay=1)
        assert not redis.Redis(port=server.port).keys(f"{prefix}:*")  # nothing written


@pytest.mark.skipif(valkey_server() is None, reason="needs the Valkey 8 binary (WAITAOF)")
def test_aof_durability_on_a_server_with_waitaof(prefix: str) -> None:
    binary = valkey_server()
    assert binary is not None
    with EmbeddedRedis(binary, aof=True) as master:
        replica = _replica_of(master, binary, "--appendonly", "yes")
        try:
            durable = Durability(replicas=1, aof=True, timeout=2.0)
            with DelayQueue("aof", master.url, prefix=prefix, durability=durable) as q:
                task_id = q.offer("on disk twice", delay=60)
                assert q.get(task_id) is not None
        finally:
            replica.stop()


def test_after_fetch_a_lease_is_on_the_replica_before_the_task_is_handed_out(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=2.0, after_fetch=True)
    with DelayQueue("fetch-durable", master.url, prefix=prefix, durability=durable) as q:
        q.offer_many([(n, 0) for n in range(3)])
        tasks = q.poll_many(3, timeout=5)
        assert len(tasks) == 3
        on_replica = redis.Redis(port=replica.port)
        try:  # WAIT returned before poll did: a failover now keeps these leases
            leases = on_replica.hmget(q.keys.key("leases"), [t.id for t in tasks])
            assert [lease.decode() for lease in leases] == [t.lease_token for t in tasks]
        finally:
            on_replica.close()
        q.ack_many(tasks)


def test_durable_fetches_and_acks_of_a_queue_with_features_go_full(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    """The durable path sends the plain fetch and ack with their WAIT: when the plain
    script refuses (the queue has a limit, a pause), the call goes again full, WAIT and
    all, and the feature holds."""
    master, replica = pair
    durable = Durability(replicas=1, timeout=2.0, after_fetch=True, after_ack=True)
    with DelayQueue("durable-limited", master.url, prefix=prefix, durability=durable) as q:
        q.limits.set("t", Limit(concurrency=1))
        q.offer_many([Offer(n, 0, limit_key="t") for n in range(3)])
        first = q.poll_many(5, timeout=5)
        assert len(first) == 1  # the limit held: the full fetch ran
        on_replica = redis.Redis(port=replica.port)
        try:
            assert on_replica.hget(q.keys.key("leases"), first[0].id) is not None
            assert q.ack_many(first) == [True]  # the full ack frees the key's slot
            assert not on_replica.hexists(q.keys.key("tasks"), first[0].id)
        finally:
            on_replica.close()
        q.pause()
        assert q.poll_many(5, timeout=0.3) == []
        q.resume()
        second = q.poll_many(5, timeout=5)
        assert len(second) == 1 and q.ack_many(second) == [True]


def test_after_fetch_an_unconfirmed_lease_is_handed_back_unstarted(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=0.3, after_fetch=True)
    with DelayQueue("fetch-stall", master.url, prefix=prefix, durability=durable) as q:
        task_id = q.offer("close order 7", delay=0)
        assert replica._proc is not None
        os.kill(replica._proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotDurable, match="handed back") as caught:
                q.poll(timeout=5)
            assert caught.value.task_ids == [task_id]
            info = q.get(task_id)
            assert info is not None and info.state == "ready" and info.attempts == 0
        finally:
            os.kill(replica._proc.pid, signal.SIGCONT)
        task = q.poll(timeout=5)  # confirmed now: handed out, its first attempt
        assert task is not None and task.id == task_id and task.attempts == 1
        task.ack()


def test_after_fetch_with_warn_hands_out_and_logs(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    master, replica = pair
    durable = Durability(replicas=1, timeout=0.3, after_fetch=True, on_shortfall="warn")
    with DelayQueue("fetch-warn", master.url, prefix=prefix, durability=durable) as q:
        q.offer("x", delay=0)
        assert replica._proc is not None
        os.kill(replica._proc.pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="delayq"):
                task = q.poll(timeout=5)
        finally:
            os.kill(replica._proc.pid, signal.SIGCONT)
        assert task is not None
        assert "not confirmed" in caplog.text and "handed out anyway" in caplog.text
        task.ack()


def test_a_worker_keeps_fetching_through_a_stalled_replica(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    import threading

    from delayq import Worker

    master, replica = pair
    durable = Durability(replicas=1, timeout=0.2, after_fetch=True)
    done: list[str] = []
    with DelayQueue("fetch-worker", master.url, prefix=prefix, durability=durable) as q:
        q.offer("a", delay=0)  # confirmed: the replica runs
        assert replica._proc is not None
        os.kill(replica._proc.pid, signal.SIGSTOP)
        stopped = True
        worker = Worker(q, lambda task: done.append(task.payload), concurrency=2)
        thread = threading.Thread(target=worker.run)
        try:
            thread.start()
            wait_until(lambda: q.stats().counters.get("delivered", 0) >= 2, timeout=15)
            assert done == []  # fetched and handed back, never run unconfirmed
            os.kill(replica._proc.pid, signal.SIGCONT)
            stopped = False
            wait_until(lambda: done == ["a"], timeout=20)
        finally:
            if stopped:
                os.kill(replica._proc.pid, signal.SIGCONT)
            worker.stop()
            if thread.is_alive():
                thread.join(10)
        info = q.stats()
        assert info.total == 0


@pytest.fixture(scope="module", params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def any_pair(request: pytest.FixtureRequest) -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    master = EmbeddedRedis(request.param).start()
    replica = _replica_of(master, request.param)
    yield master, replica
    replica.stop()
    master.stop()


@pytest.mark.parametrize("op", ["offer", "offer-drawn-id", "cancel", "reschedule"])
def test_a_durable_write_resent_on_a_new_connection_still_waits_for_its_copies(
    any_pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str, op: str
) -> None:
    """The reply of a durable write is lost (its connection cut) while the replica is
    stalled. The resend, on a new connection, is answered from the first call's receipt (or
    finds its offer there) and writes nothing; a WAIT covers only its own connection's
    writes, so without a write of its own it confirmed the first one at once (Valkey 8): the
    call returned as durable though no replica had it. It raises NotDurable."""
    master, replica = any_pair
    proxy = DropReplyProxy(master.port)
    admin = redis.Redis(port=master.port)
    with DelayQueue("resent", master.url, prefix=prefix) as plain:
        plain.offer_many([Offer("close", 60, id="order-1")])
    durable = Durability(replicas=1, timeout=0.5)
    q = DelayQueue("resent", proxy.url, prefix=prefix, durability=durable)
    q.stats()
    assert replica._proc is not None
    os.kill(replica._proc.pid, signal.SIGSTOP)
    try:
        armed = {"offer": Op.OFFER, "offer-drawn-id": Op.OFFER_ONE, "cancel": Op.CANCEL}
        proxy.arm(armed.get(op, Op.RESCHEDULE), admin)
        with pytest.raises(NotDurable, match="0 of 1 replicas"):
            if op == "offer":
                q.offer("close", 60, id="order-2")
            elif op == "offer-drawn-id":
                q.offer("close", 60)
            elif op == "cancel":
                q.cancel("order-1")
            else:
                q.reschedule("order-1", 600)
        assert proxy.dropped.is_set(), "the reply was not lost: the test tested nothing"
    finally:
        os.kill(replica._proc.pid, signal.SIGCONT)
        q.close()
        proxy.close()
        admin.close()


def test_an_offer_of_an_id_another_connection_wrote_waits_for_its_copies(
    any_pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    """A producer that died after its offer (or whose offer raised NotDurable) offers the
    same id again from a new process: the script finds the task and writes nothing, so its
    WAIT alone confirmed nothing of the first write (Valkey 8: at once, with the replica
    stalled). It raises NotDurable until the replica has the task, then confirms it."""
    master, replica = any_pair
    durable = Durability(replicas=1, timeout=0.5)
    assert replica._proc is not None
    os.kill(replica._proc.pid, signal.SIGSTOP)
    try:
        with DelayQueue("again", master.url, prefix=prefix) as first:
            first.offer("close", 60, id="order-1")  # never confirmed
        with (
            DelayQueue("again", master.url, prefix=prefix, durability=durable) as q,
            pytest.raises(NotDurable, match="0 of 1 replicas"),
        ):
            q.offer("close", 60, id="order-1")
    finally:
        os.kill(replica._proc.pid, signal.SIGCONT)
    with DelayQueue("again", master.url, prefix=prefix, durability=durable) as q:
        again = q.offer("close", 60, id="order-1")
        assert again.outcome == "existing"
