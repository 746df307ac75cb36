"""Workers on queues whose Redis servers fail apart, and the errors a handler raises: what
one queue's outage must not do to another's leases and acks (found in a review of the
workers, each test failing before its fix)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, TaskState, Worker
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

LEASE = 4.0


@dataclass
class Handled:
    """What the worker's handlers did, by task id; ``release`` lets them return."""

    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    runs: list[tuple[str, int]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@contextlib.contextmanager
def worker_on_two_servers(
    kind: str, url_a: str, url_b: str, prefix: str, b_linger: float = 0.0
) -> Iterator[Handled]:
    """A Worker or an AsyncWorker (``kind``) on queue "a" of one server and "b" of another,
    in a thread; its handlers run until ``release``, b1's ``b_linger`` s more."""
    handled, state = Handled(), {}

    def begin(task: Any) -> None:
        handled.started[task.id] = time.monotonic()
        handled.runs.append((task.id, task.attempts))

    def sync_handler(task: Any) -> None:
        begin(task)
        handled.release.wait(25)
        time.sleep(b_linger if task.id == "b1" else 0)
        handled.ended[task.id] = time.monotonic()

    async def async_handler(task: Any) -> None:
        begin(task)
        while not handled.release.is_set():
            await asyncio.sleep(0.02)
        await asyncio.sleep(b_linger if task.id == "b1" else 0)
        handled.ended[task.id] = time.monotonic()

    options = {"concurrency": 2, "prefetch": 0, "grace": 0.5, "visibility_timeout": LEASE}

    def main() -> None:
        if kind == "thread":
            queues = [
                DelayQueue(name, url, prefix=prefix, safety_interval=0.5)
                for name, url in (("a", url_a), ("b", url_b))
            ]
            try:
                state["worker"] = Worker(queues, sync_handler, **options)
                state["worker"].run()
            finally:  # a worker leaves the queues it was given open: their owner closes them
                for queue in queues:
                    queue.close()
            return

        async def amain() -> None:
            queues = [
                AsyncDelayQueue(name, url, prefix=prefix, safety_interval=0.5)
                for name, url in (("a", url_a), ("b", url_b))
            ]
            try:
                state["worker"] = AsyncWorker(queues, async_handler, **options)
                state["loop"] = asyncio.get_running_loop()
                await state["worker"].run()
            finally:
                for queue in queues:
                    await queue.close()

        asyncio.run(amain())

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        yield handled
    finally:
        handled.release.set()
        if kind == "thread" and "worker" in state:
            state["worker"].stop()
        elif "loop" in state:
            state["loop"].call_soon_threadsafe(state["worker"].stop)
        thread.join(60)


@pytest.fixture
def other(redis7_server: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    """The second server: queue "a" lives there."""
    server = EmbeddedRedis(redis7_server.binary).start()
    yield server
    server.stop()


def offer_a1_and_b1(other: EmbeddedRedis, redis7_server: EmbeddedRedis, prefix: str) -> None:
    with DelayQueue("a", other.url, prefix=prefix) as pa:
        pa.offer("A", delay=0, id="a1")
    with DelayQueue("b", redis7_server.url, prefix=prefix) as pb:
        pb.offer("B", delay=0, id="b1")


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_queue_whose_redis_is_away_holds_up_no_other_queues_leases(
    redis7_server: EmbeddedRedis, other: EmbeddedRedis, prefix: str, kind: str
) -> None:
    """A worker on two queues on two servers, one of which goes away: the other queue's
    running task keeps its lease (before: its extensions waited behind the dead server's,
    one by one, and it was delivered to a second consumer while its handler ran)."""
    offer_a1_and_b1(other, redis7_server, prefix)
    with (
        worker_on_two_servers(kind, other.url, redis7_server.url, prefix) as handled,
        DelayQueue("b", redis7_server.url, prefix=prefix, visibility_timeout=LEASE) as pb,
    ):
        wait_until(lambda: {"a1", "b1"} <= handled.started.keys(), 10)
        other.kill()  # queue a's Redis goes away; queue b's stays healthy
        second = pb.poll(timeout=2 * LEASE + 2)  # another consumer of queue b
        assert second is None, "b1 went to a second consumer while its handler ran"


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_done_task_keeps_its_lease_while_its_ack_waits_behind_another_queue(
    redis7_server: EmbeddedRedis, other: EmbeddedRedis, prefix: str, kind: str
) -> None:
    """The same two queues; both handlers succeed as the first server goes away: the healthy
    queue's ack waits behind the other's, and its lease is extended meanwhile (before: not,
    and the finished task ran again)."""
    offer_a1_and_b1(other, redis7_server, prefix)
    with (
        worker_on_two_servers(kind, other.url, redis7_server.url, prefix, 0.3) as handled,
        DelayQueue("b", redis7_server.url, prefix=prefix, visibility_timeout=LEASE) as pb,
    ):
        wait_until(lambda: {"a1", "b1"} <= handled.started.keys(), 10)
        other.kill()  # queue a's Redis goes away; queue b's stays healthy
        handled.release.set()  # both succeed; b1 a little later, with a1's ack on its way
        wait_until(lambda: "b1" in handled.ended, 5)
        second = pb.poll(timeout=2 * LEASE + 2)  # another consumer of queue b
        b_runs = [run for run in handled.runs if run[0] == "b1"]
        assert second is None and len(b_runs) == 1, (second, b_runs)


def _run_async_worker(url, prefix, handler, **worker_options):
    state = {}

    def main():
        async def amain():
            q = AsyncDelayQueue(
                "q",
                url,
                prefix=prefix,
                safety_interval=0.5,
                retry_backoff=Backoff(base=60, max=60, jitter=0.0),
            )
            w = AsyncWorker(q, handler, concurrency=1, grace=1.0, **worker_options)
            state["worker"], state["loop"] = w, asyncio.get_running_loop()
            try:
                await w.run()
            finally:
                await q.close()

        asyncio.run(amain())

    t = threading.Thread(target=main, daemon=True)
    t.start()
    wait_until(lambda: "worker" in state and state["worker"].health().state == "running", 5)
    return state, t


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_handlers_own_timeout_error_is_its_error_not_a_worker_timeout(
    redis7_server, prefix, timeout
):
    """AsyncWorker, with or without ``timeout=``: a TimeoutError the handler raises (a client
    of its timed out) is recorded as it is (before: counted as the worker's timeout and
    rewritten as 'handler timed out after Nones')."""

    async def handler(task):
        raise TimeoutError("upstream HTTP call timed out")

    producer = DelayQueue("q", redis7_server.url, prefix=prefix)
    try:
        producer.offer({"n": 1}, delay=0, id="t1")
        state, thread = _run_async_worker(redis7_server.url, prefix, handler, timeout=timeout)
        w = state["worker"]
        # The failure is counted before it is recorded in Redis: wait for the record.
        info = wait_until(lambda: (i := producer.get("t1")) is not None and i.last_error and i, 10)
        state["loop"].call_soon_threadsafe(w.stop)
        thread.join(15)
        health = w.health()
        assert health.timed_out == 0, "no worker timeout is configured, yet a timeout is counted"
        assert "upstream HTTP call timed out" in (info.last_error or ""), info.last_error
    finally:
        producer.close()


def test_a_fetch_that_gets_through_during_a_shutdown_is_handed_back(redis7_server, prefix):
    """Thread Worker stopped during an outage: its fetch, riding the outage out, gets a task
    once Redis is back. The shutdown waits for it and hands the task back (before: it waited
    5 s for the fetcher, and the task stayed leased to the stopped worker for its lease)."""
    server = EmbeddedRedis(redis7_server.binary, aof=True).start()
    ran: list[str] = []
    q = DelayQueue("q", server.url, prefix=prefix, safety_interval=0.5, visibility_timeout=60)
    producer = DelayQueue("q", server.url, prefix=prefix)
    try:
        w = Worker(q, lambda t: ran.append(t.id), concurrency=1, grace=1.0)
        handle = w.start_background()
        wait_until(lambda: w.health().state == "running", 5)
        producer.offer("X", delay=3.0, id="x")  # due while Redis is away
        producer.close()
        time.sleep(0.3)  # the worker heard of it: its fetch waits for its due time
        server.kill()  # an outage (a failover...) begins
        killed = time.monotonic()
        time.sleep(0.5)  # the fetch is riding the outage out
        stopper = threading.Thread(target=handle.stop, daemon=True)
        stopper.start()  # a graceful stop during the outage
        # The scenario's clock: Redis comes back past the old 5-s wait for the fetcher,
        # within the queue's reconnect timeout (10 s).
        time.sleep(max(0.0, killed + 6.5 - time.monotonic()))
        server.start()
        stopper.join(30)
        assert not stopper.is_alive()
        time.sleep(3)  # what a fetch let go by the shutdown would need to land (before)
        with DelayQueue("q", server.url, prefix=prefix) as checker:
            info = checker.get("x")
        assert info is not None and info.state is not TaskState.INFLIGHT, info
        assert ran == []  # not run by the stopping worker: handed back
    finally:
        q.close()
        server.stop()
