"""Workers on queues whose Redis servers fail apart, and the errors a handler raises: what
one queue's outage must not do to another's leases and acks (found in a review of the
workers, each test failing before its fix)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, TaskState, Worker
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

LEASE = 4.0


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_queue_whose_redis_is_away_holds_up_no_other_queues_leases(redis7_server, prefix, kind):
    """A worker on two queues on two servers, one of which goes away: the other queue's
    running task keeps its lease (before: its extensions waited behind the dead server's,
    one by one, and it was delivered to a second consumer while its handler ran)."""
    other = EmbeddedRedis(redis7_server.binary).start()  # queue "a" lives here
    release = threading.Event()
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    state: dict = {}

    def on_task(task):
        started[task.id] = time.monotonic()

    def sync_handler(task):
        on_task(task)
        release.wait(25)
        ended[task.id] = time.monotonic()

    async def async_handler(task):
        on_task(task)
        while not release.is_set():
            await asyncio.sleep(0.05)
        ended[task.id] = time.monotonic()

    def main():
        try:
            if kind == "thread":
                qa = DelayQueue("a", other.url, prefix=prefix, safety_interval=0.5)
                qb = DelayQueue("b", redis7_server.url, prefix=prefix, safety_interval=0.5)
                w = Worker(
                    [qa, qb],
                    sync_handler,
                    concurrency=2,
                    prefetch=0,
                    grace=0.5,
                    visibility_timeout=LEASE,
                )
                state["worker"] = w
                w.run()
            else:

                async def amain():
                    qa = AsyncDelayQueue("a", other.url, prefix=prefix, safety_interval=0.5)
                    qb = AsyncDelayQueue("b", redis7_server.url, prefix=prefix, safety_interval=0.5)
                    w = AsyncWorker(
                        [qa, qb],
                        async_handler,
                        concurrency=2,
                        prefetch=0,
                        grace=0.5,
                        visibility_timeout=LEASE,
                    )
                    state["worker"], state["loop"] = w, asyncio.get_running_loop()
                    await w.run()

                asyncio.run(amain())
        except BaseException as exc:
            state["error"] = exc

    pa = DelayQueue("a", other.url, prefix=prefix)
    pb = DelayQueue("b", redis7_server.url, prefix=prefix, visibility_timeout=LEASE)
    thread = threading.Thread(target=main, daemon=True)
    try:
        pa.offer("A", delay=0, id="a1")
        pb.offer("B", delay=0, id="b1")
        pa.close()
        thread.start()
        wait_until(lambda: "a1" in started and "b1" in started, 10)
        other.kill()  # queue a's Redis goes away; queue b's stays healthy
        killed = time.monotonic()
        second = pb.poll(timeout=2 * LEASE + 2)  # another consumer of queue b
        got_at = time.monotonic()
        assert second is None, (
            f"b1 was delivered to a second consumer {got_at - killed:.1f}s after the OTHER "
            "queue's Redis went away, while the worker's handler of b1 was still running"
        )
    finally:
        release.set()
        if "worker" in state:
            if kind == "thread":
                state["worker"].stop()
            else:
                state["loop"].call_soon_threadsafe(state["worker"].stop)
        thread.join(60)
        pb.close()
        other.stop()


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_done_task_keeps_its_lease_while_its_ack_waits_behind_another_queue(
    redis7_server, prefix, kind
):
    """The same two queues; both handlers succeed as the first server goes away: the healthy
    queue's ack waits behind the other's, and its lease is extended meanwhile (before: not,
    and the finished task ran again)."""
    other = EmbeddedRedis(redis7_server.binary).start()  # queue "a" lives here
    release = threading.Event()
    started: dict[str, float] = {}
    runs: list[tuple[str, int]] = []
    ended: dict[str, float] = {}
    state: dict = {}

    def sync_handler(task):
        started[task.id] = time.monotonic()
        runs.append((task.id, task.attempts))
        release.wait(25)
        if task.id == "b1":  # a1's ack goes first, b1's comes while it is on its way
            time.sleep(0.3)
        ended[task.id] = time.monotonic()

    async def async_handler(task):
        started[task.id] = time.monotonic()
        runs.append((task.id, task.attempts))
        while not release.is_set():
            await asyncio.sleep(0.02)
        if task.id == "b1":  # a1's ack goes first, b1's comes while it is on its way
            await asyncio.sleep(0.3)
        ended[task.id] = time.monotonic()

    def main():
        try:
            if kind == "thread":
                qa = DelayQueue("a", other.url, prefix=prefix, safety_interval=0.5)
                qb = DelayQueue("b", redis7_server.url, prefix=prefix, safety_interval=0.5)
                w = Worker(
                    [qa, qb],
                    sync_handler,
                    concurrency=2,
                    prefetch=0,
                    grace=0.5,
                    visibility_timeout=LEASE,
                )
                state["worker"] = w
                w.run()
            else:

                async def amain():
                    qa = AsyncDelayQueue("a", other.url, prefix=prefix, safety_interval=0.5)
                    qb = AsyncDelayQueue("b", redis7_server.url, prefix=prefix, safety_interval=0.5)
                    w = AsyncWorker(
                        [qa, qb],
                        async_handler,
                        concurrency=2,
                        prefetch=0,
                        grace=0.5,
                        visibility_timeout=LEASE,
                    )
                    state["worker"], state["loop"] = w, asyncio.get_running_loop()
                    await w.run()

                asyncio.run(amain())
        except BaseException as exc:
            state["error"] = exc

    pa = DelayQueue("a", other.url, prefix=prefix)
    pb = DelayQueue("b", redis7_server.url, prefix=prefix, visibility_timeout=LEASE)
    thread = threading.Thread(target=main, daemon=True)
    try:
        pa.offer("A", delay=0, id="a1")
        pb.offer("B", delay=0, id="b1")
        pa.close()
        thread.start()
        wait_until(lambda: "a1" in started and "b1" in started, 10)
        other.kill()  # queue a's Redis goes away; queue b's stays healthy
        release.set()  # both handlers succeed now
        wait_until(lambda: "b1" in ended, 5)
        second = pb.poll(timeout=2 * LEASE + 2)  # another consumer of queue b
        b_runs = [r for r in runs if r[0] == "b1"]
        assert second is None and len(b_runs) == 1, (
            f"b1 succeeded in the worker but its ack was held back; it was delivered again "
            f"(second consumer: {second}, worker runs: {b_runs})"
        )
    finally:
        release.set()
        if "worker" in state:
            if kind == "thread":
                state["worker"].stop()
            else:
                state["loop"].call_soon_threadsafe(state["worker"].stop)
        thread.join(60)
        pb.close()
        other.stop()


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
