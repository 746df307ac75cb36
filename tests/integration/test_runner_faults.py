"""The connection layer through a failover and a close (found in a review of the runner):

- a standalone URL whose address leads to the new master after a failover (a DNS name, a
  virtual IP, a Kubernetes service): the old master answers READONLY, and the runner dials
  again instead of retrying on its connection to the demoted server;
- a call waiting between two tries when its queue is closed does not go out after the close;
- after a Sentinel switch, whose watch closes the pool under the kept connection, a call
  posted before it is not answered with the reply of a call posted after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from delayq import AsyncDelayQueue, DelayQueue, QueueClosed
from delayq._async.runner import connect
from delayq._core.keys import QueueKeys
from delayq._core.protocol import parse_info
from delayq._core.scripts import Op, script
from delayq.embedded import EmbeddedRedis, free_port
from tests.conftest import BINARIES
from tests.helpers import wait_until
from tests.outbox_support import TcpProxy
from tests.topology import SentinelGroup, running

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    """A master and its replica."""
    a = EmbeddedRedis(BINARIES[0][1]).start()
    b = EmbeddedRedis(BINARIES[0][1], extra_args=["--replicaof", "127.0.0.1", str(a.port)])
    try:
        b.start()
        yield a, b
    finally:
        b.stop()
        a.stop()


def test_calls_reach_the_new_master_behind_the_same_address_after_a_failover(
    pair: tuple[EmbeddedRedis, EmbeddedRedis], prefix: str
) -> None:
    a, b = pair
    proxy = TcpProxy(a.port).up()  # the one address clients know, leading to the master
    queue = DelayQueue("q", f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix,
                       reconnect_timeout=5)  # fmt: skip
    try:
        first = queue.offer({"n": 0})
        with redis.Redis(port=a.port) as old, redis.Redis(port=b.port) as new:
            wait_until(lambda: new.exists(queue.keys.key("tasks")), timeout=10)
            new.replicaof("NO", "ONE")  # the failover: b promoted, a demoted under it
            old.replicaof("127.0.0.1", b.port)
            proxy.target = ("127.0.0.1", b.port)  # the address follows, as DNS would
            second = queue.offer({"n": 1})  # before: RedisUnavailable (READONLY, 9 tries)
            assert queue.get(first) is not None and queue.get(second) is not None
            assert new.hexists(queue.keys.key("tasks"), second)
    finally:
        queue.close()
        proxy.down()


def tries(queue: AsyncDelayQueue) -> int:
    """The failed tries of the outage under way on the queue's connections."""
    outage = queue._runner._outage.get("now")
    return 0 if outage is None else outage.tries


async def eventually(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        await asyncio.sleep(0.01)


async def test_a_call_waiting_to_try_again_when_its_queue_closes_does_not_go_out(
    prefix: str,
) -> None:
    server = EmbeddedRedis(BINARIES[0][1]).start()
    admin = redis.Redis(port=server.port)
    try:
        queue = AsyncDelayQueue("q", server.url, prefix=prefix, reconnect_timeout=30)
        await queue.offer({"n": 0})  # connected
        admin.replicaof("127.0.0.1", free_port())  # demoted, its master away: READONLY
        offer = asyncio.create_task(queue.offer({"n": 1}))
        # Past its first tries the call spends most of its time in the pauses between them
        # (0.3 s and longer from the fifth on): the close lands in one.
        await eventually(lambda: tries(queue) >= 5, 10)
        await queue.close()
        admin.replicaof("NO", "ONE")  # writable again: a try after the close would land
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(offer, 30)
        assert admin.hlen(queue.keys.key("tasks")) == 1  # only the first offer
        names = [c.get("name", "") for c in admin.client_list()]
        assert not [n for n in names if n.startswith("delayq")], names  # none reopened
    finally:
        admin.close()
        server.stop()


@pytest.mark.topology
async def test_a_call_posted_before_a_sentinel_switch_gets_its_own_reply(prefix: str) -> None:
    with running(SentinelGroup(BINARIES[0][1], replicas=1, sentinels=1, quorum=1)) as group:
        runner = connect(group.url, "delayq")
        try:
            queue = AsyncDelayQueue("q", runner, prefix=prefix)
            id_a = str(await queue.offer("A", delay=3600))
            id_b = str(await queue.offer("B", delay=3600))
            keys = QueueKeys(prefix, "q").all
            await runner.outcome(await runner.post(Op.INFO, keys, [id_a]))  # loaded, read
            group.wait_replicas_synced(group.master())
            posted_a = await runner.post(Op.INFO, keys, [id_a])
            assert posted_a.written

            await asyncio.to_thread(group.failover)
            # the runner's watch hears +switch-master and disconnects the pool, the kept
            # connection included (checked out of it)
            await asyncio.to_thread(
                wait_until, lambda: not runner._kept.conn.is_connected, 30
            )  # fmt: skip
            with redis.Redis(port=group.wait_settled().port) as new_master:
                new_master.script_load(script(Op.INFO).source)  # as a master before had
            posted_b = await runner.post(Op.INFO, keys, [id_b])

            info_a = parse_info(await runner.outcome(posted_a, deadline=None))
            info_b = parse_info(await runner.outcome(posted_b, deadline=None))
            assert b'"A"' in info_a.envelope, info_a.envelope  # before: B's reply
            assert b'"B"' in info_b.envelope, info_b.envelope  # before: after a 5-s stall
        finally:
            await runner.close()
