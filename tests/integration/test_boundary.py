"""The one-way boundary between queues and workers (issue #12), checked by behaviour.

A worker's own ``visibility_timeout`` / ``max_attempts`` / ``retry_backoff`` apply to the tasks
it handles and to nothing else: tasks taken from the queue object afterwards (or beside the
worker) get the queue's own lease, attempts limit and backoff, also when the constructor
raised. ``queue.with_policy()`` views, ``start_background()``, sharded queues, and handlers of the
wrong kind (refused at construction, or run correctly), for the thread and asyncio workers
and for the ``delayq worker`` command's choice between them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from delayq import (
    AsyncDelayQueue,
    AsyncTask,
    AsyncWorker,
    Backoff,
    ConfigError,
    DelayQueue,
    QueueClosed,
    Task,
    TaskState,
    Worker,
)
from delayq.embedded import EmbeddedRedis

from ..helpers import wait_until

QUEUE_LEASE_S = 30.0
QUEUE_BACKOFF = Backoff(base=60, max=60, jitter=0)  # a retry is due in exactly 60 s
QUEUE_ATTEMPTS = 2
# A worker's own settings, far from the queue's so that either one shows.
WORKER_OPTIONS: dict[str, Any] = {
    "visibility_timeout": 2.0,
    "max_attempts": 9,
    "retry_backoff": Backoff(base=0.05, max=0.05, jitter=0),
}
SHARDS = pytest.mark.parametrize("shards", [None, 4], ids=["plain", "sharded"])


@pytest.fixture
def make_queue(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., DelayQueue]]:
    """Sync queues with the queue-side policy above (one Redis version: nothing here depends
    on it); closed after the test."""
    made: list[DelayQueue] = []

    def make(name: str = "q", **options: Any) -> DelayQueue:
        options = {"prefix": prefix, **policy_options(options), **options}
        made.append(DelayQueue(name, redis7_server.url, **options))
        return made[-1]

    yield make
    for q in made:
        q.close()


@pytest.fixture
async def make_async_queue(
    redis7_server: EmbeddedRedis, prefix: str
) -> AsyncIterator[Callable[..., AsyncDelayQueue]]:
    made: list[AsyncDelayQueue] = []

    def make(name: str = "q", **options: Any) -> AsyncDelayQueue:
        options = {"prefix": prefix, **policy_options(options), **options}
        made.append(AsyncDelayQueue(name, redis7_server.url, **options))
        return made[-1]

    yield make
    for q in made:
        await q.close()


def policy_options(options: dict[str, Any]) -> dict[str, Any]:
    if options.get("ack") is False:
        return {}
    return {
        "visibility_timeout": QUEUE_LEASE_S,
        "max_attempts": QUEUE_ATTEMPTS,
        "retry_backoff": QUEUE_BACKOFF,
    }


def seconds_until(moment: datetime | None) -> float:
    assert moment is not None
    return (moment - datetime.now(UTC)).total_seconds()


def taken(task: Any) -> Any:
    assert task is not None, "no task within the timeout"
    return task


def noop(task: Task) -> None:
    return None


async def async_noop(task: AsyncTask) -> None:
    return None


def assert_queue_policy(q: DelayQueue) -> None:
    """The queue hands tasks out with its own lease, backoff and attempts limit."""
    lease = q.offer("lease")
    task = taken(q.poll(timeout=10))
    assert task.id == lease
    assert seconds_until(q.get(task.id).lease_expires_at) > QUEUE_LEASE_S - 5  # type: ignore[union-attr]
    task.retry()  # the queue's backoff: due in 60 s, not 0.05 s
    assert seconds_until(q.get(task.id).due_at) > 50  # type: ignore[union-attr]
    assert q.cancel(task.id)
    q.offer("attempts")
    for attempt in range(1, QUEUE_ATTEMPTS + 1):
        task = taken(q.poll(timeout=10))
        assert task.attempts == attempt
        task.retry(delay=0)
    info = q.get(task.id)
    assert info is not None and info.state is TaskState.DEAD  # the queue's 2, not the worker's 9
    q.purge(["dead"])


async def assert_async_queue_policy(q: AsyncDelayQueue) -> None:
    await q.offer("lease")
    task = taken(await q.poll(timeout=10))
    assert seconds_until((await q.get(task.id)).lease_expires_at) > QUEUE_LEASE_S - 5  # type: ignore[union-attr]
    await task.retry()
    assert seconds_until((await q.get(task.id)).due_at) > 50  # type: ignore[union-attr]
    assert await q.cancel(task.id)
    await q.offer("attempts")
    for _ in range(QUEUE_ATTEMPTS):
        task = taken(await q.poll(timeout=10))
        await task.retry(delay=0)
    assert (await q.get(task.id)).state is TaskState.DEAD  # type: ignore[union-attr]
    await q.purge(["dead"])


# -- a worker's own options stay its own -------------------------------------------------------


@SHARDS
def test_building_and_running_a_worker_with_its_own_options_leaves_the_queue(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    policy = q.policy
    busy, release = threading.Event(), threading.Event()

    def handle(task: Task) -> None:
        busy.set()
        assert release.wait(20)

    # One slot, nothing fetched ahead: while its handler waits, the worker takes no task.
    worker = Worker(q, handle, concurrency=1, prefetch=0, **WORKER_OPTIONS)
    assert q.policy == policy
    assert_queue_policy(q)  # built, not run
    with worker.start_background():
        q.offer("held by the worker")
        assert busy.wait(10)
        assert_queue_policy(q)  # beside the running worker
        release.set()
    assert q.stats().counters["acked"] == 1
    assert q.policy == policy
    assert_queue_policy(q)  # after it stopped


@SHARDS
async def test_building_and_running_an_async_worker_with_its_own_options_leaves_the_queue(
    make_async_queue: Callable[..., AsyncDelayQueue], shards: int | None
) -> None:
    q = make_async_queue(shards=shards)
    policy = q.policy
    busy, release = asyncio.Event(), asyncio.Event()

    async def handle(task: AsyncTask) -> None:
        busy.set()
        await asyncio.wait_for(release.wait(), 20)

    worker = AsyncWorker(q, handle, concurrency=1, prefetch=0, **WORKER_OPTIONS)
    assert q.policy == policy
    await assert_async_queue_policy(q)
    async with worker.start_background():
        await q.offer("held by the worker")
        await asyncio.wait_for(busy.wait(), 10)
        await assert_async_queue_policy(q)
        release.set()
        for _ in range(500):  # acked before the stop: this test is about the policy
            if (await q.stats()).counters.get("acked") == 1:
                break
            await asyncio.sleep(0.01)
    assert (await q.stats()).counters.get("acked") == 1
    assert q.policy == policy
    await assert_async_queue_policy(q)


@SHARDS
def test_a_constructor_that_raises_leaves_the_queues(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    at_most_once = make_queue("amo", ack=False)
    policy = q.policy
    # The first queue could take the worker's lease, the second cannot: nothing changes.
    with pytest.raises(ConfigError, match="at-most-once"):
        Worker([q, at_most_once], noop, **WORKER_OPTIONS)
    with pytest.raises(ConfigError, match="async def"):
        Worker(q, async_noop, **WORKER_OPTIONS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_attempts"):
        Worker(q, noop, visibility_timeout=2, max_attempts=0)
    assert q.policy == policy
    assert_queue_policy(q)


@SHARDS
async def test_an_async_constructor_that_raises_leaves_the_queues(
    make_async_queue: Callable[..., AsyncDelayQueue], shards: int | None
) -> None:
    q = make_async_queue(shards=shards)
    at_most_once = make_async_queue("amo", ack=False)
    policy = q.policy
    with pytest.raises(ConfigError, match="at-most-once"):
        AsyncWorker([q, at_most_once], async_noop, **WORKER_OPTIONS)
    with pytest.raises(ConfigError, match="plain function"):
        AsyncWorker(q, noop, **WORKER_OPTIONS)  # type: ignore[arg-type]
    assert q.policy == policy
    await assert_async_queue_policy(q)


@SHARDS
def test_two_workers_on_one_queue_object_each_apply_their_own_options(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    """Both run at once on the same object; each handler sees its worker's lease, and its
    failure is judged by its worker's attempts limit and backoff."""
    q = make_queue(shards=shards)
    both_started = threading.Barrier(2, timeout=10)
    leases: dict[str, float] = {}

    def handler_of(name: str) -> Callable[[Task], None]:
        def handle(task: Task) -> None:
            both_started.wait()  # each worker holds one task: they cannot be the same worker's
            leases[name] = seconds_until(q.get(task.id).lease_expires_at)  # type: ignore[union-attr]
            raise RuntimeError(f"{name} fails {task.payload}")

        return handle

    short = Worker(
        q, handler_of("short"), concurrency=1, prefetch=0, visibility_timeout=3, max_attempts=1
    )
    long = Worker(
        q,
        handler_of("long"),
        concurrency=1,
        prefetch=0,
        visibility_timeout=20,
        max_attempts=5,
        retry_backoff=Backoff(base=40, max=40, jitter=0),
    )
    ids = [q.offer(n) for n in ("one", "two")]
    with short.start_background(), long.start_background():
        wait_until(lambda: len(leases) == 2, timeout=15)
        wait_until(lambda: q.stats().inflight == 0, timeout=10)
    assert leases["short"] <= 3.1
    assert 15 < leases["long"] <= 20.1
    states = sorted(q.get(task_id).state for task_id in ids)  # type: ignore[union-attr]
    # short: 1 attempt allowed, so dead; long: retried after its own 40 s (the queue's is 60).
    assert states == [TaskState.DEAD, TaskState.DELAYED]
    retried = next(i for i in map(q.get, ids) if i is not None and i.state is TaskState.DELAYED)
    assert 30 < seconds_until(retried.due_at) <= 40.1
    assert_queue_policy(q)


@SHARDS
async def test_two_async_workers_on_one_queue_object_each_apply_their_own_options(
    make_async_queue: Callable[..., AsyncDelayQueue], shards: int | None
) -> None:
    q = make_async_queue(shards=shards)
    both_started = asyncio.Barrier(2)
    leases: dict[str, float] = {}

    def handler_of(name: str) -> Callable[[AsyncTask], Any]:
        async def handle(task: AsyncTask) -> None:
            await asyncio.wait_for(both_started.wait(), 10)
            info = await q.get(task.id)
            leases[name] = seconds_until(info.lease_expires_at)  # type: ignore[union-attr]
            raise RuntimeError(f"{name} fails")

        return handle

    short = AsyncWorker(
        q, handler_of("short"), concurrency=1, prefetch=0, visibility_timeout=3, max_attempts=1
    )
    long = AsyncWorker(
        q,
        handler_of("long"),
        concurrency=1,
        prefetch=0,
        visibility_timeout=20,
        max_attempts=5,
        retry_backoff=Backoff(base=40, max=40, jitter=0),
    )
    ids = [await q.offer(n) for n in ("one", "two")]
    async with short.start_background(), long.start_background():
        for _ in range(1000):
            if len(leases) == 2 and (await q.stats()).inflight == 0:
                break
            await asyncio.sleep(0.02)
    assert leases["short"] <= 3.1 and 15 < leases["long"] <= 20.1
    states = sorted([(await q.get(task_id)).state for task_id in ids])  # type: ignore[union-attr]
    assert states == [TaskState.DEAD, TaskState.DELAYED]
    await assert_async_queue_policy(q)


@pytest.mark.parametrize(
    "shards",
    [
        None,
        4,
    ],
    ids=["plain", "sharded"],
)
def test_a_worker_keeps_its_own_lease_while_the_handler_runs(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    lease_left: list[float] = []

    def handle(task: Task) -> None:
        time.sleep(3)  # the work: longer than the worker's 2 s lease, kept by its heartbeats
        info = q.get(task.id)
        lease_left.append(
            seconds_until(info.lease_expires_at) if info and info.lease_expires_at else 0
        )

    with Worker(q, handle, visibility_timeout=2).start_background():
        q.offer("slow")
        wait_until(lambda: lease_left, timeout=30)  # a loaded machine: slow to start
        assert 0 < lease_left[0] <= 2.1, lease_left
        wait_until(lambda: q.stats().counters.get("acked", 0) == 1, timeout=10)
    assert q.with_policy(visibility_timeout=2).policy.visibility_timeout == 2


@SHARDS
def test_a_handler_that_finishes_during_the_shutdown_is_acked(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    busy, release = threading.Event(), threading.Event()

    def handle(task: Task) -> None:
        busy.set()
        assert release.wait(10)

    background = Worker(q, handle, concurrency=1, **WORKER_OPTIONS).start_background()
    q.offer("x")
    assert busy.wait(10)
    release.set()  # the handler ends within the grace of the stop that follows at once
    background.stop()
    stats = q.stats()
    assert (stats.counters.get("acked"), stats.inflight, stats.ready) == (1, 0, 0)


# -- views -----------------------------------------------------------------------------------


@SHARDS
def test_with_policy_on_an_at_most_once_queue_refuses_a_lease(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(ack=False, shards=shards)
    with pytest.raises(ConfigError, match="at-most-once"):
        q.with_policy(visibility_timeout=5)
    with pytest.raises(ConfigError, match="at-most-once"):
        Worker(q, noop, visibility_timeout=5)
    assert q.policy.at_most_once
    q.offer("x")
    q.take()  # at-most-once: the task leaves the queue as it is handed out
    assert q.stats().inflight == 0


@SHARDS
async def test_async_with_policy_on_an_at_most_once_queue_refuses_a_lease(
    make_async_queue: Callable[..., AsyncDelayQueue], shards: int | None
) -> None:
    q = make_async_queue(ack=False, shards=shards)
    with pytest.raises(ConfigError, match="at-most-once"):
        q.with_policy(visibility_timeout=5)
    with pytest.raises(ConfigError, match="at-most-once"):
        AsyncWorker(q, async_noop, visibility_timeout=5)


@pytest.mark.parametrize(
    "shards",
    [
        None,
        4,
    ],
    ids=["plain", "sharded"],
)
def test_a_view_hands_out_its_own_lease_and_closing_it_leaves_the_base(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    view = q.with_policy(visibility_timeout=3)
    assert q.policy.visibility_timeout == QUEUE_LEASE_S
    view.offer("through the view")
    task = view.take()
    assert seconds_until(view.get(task.id).lease_expires_at) <= 3.1  # type: ignore[union-attr]
    task.ack()
    view.close()
    with pytest.raises(QueueClosed):
        view.offer("closed view")
    assert_queue_policy(q)  # the base still works, with its own policy


@SHARDS
def test_closing_the_base_closes_its_views(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    view = q.with_policy(max_attempts=5)
    q.close()
    with pytest.raises(QueueClosed):
        view.offer("x")
    with pytest.raises(QueueClosed):
        view.poll()


@SHARDS
def test_closing_the_base_hands_back_what_its_views_fetched_ahead(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    watcher = make_queue(shards=shards)  # another object on the same queue, left open
    view = q.with_policy(visibility_timeout=20)
    q.offer_many([(n, 0) for n in range(40)])  # several on every shard
    taken(view.poll(timeout=10)).ack()  # the ack leases the next due tasks of its shard ahead
    assert watcher.stats().inflight > 0
    q.close()
    assert watcher.stats().inflight == 0


async def test_async_views_close_one_way(
    make_async_queue: Callable[..., AsyncDelayQueue],
) -> None:
    q = make_async_queue()
    view = q.with_policy(visibility_timeout=3)
    await view.close()
    with pytest.raises(QueueClosed):
        await view.offer("closed view")
    await assert_async_queue_policy(q)
    other = q.with_policy(max_attempts=5)
    await q.close()
    with pytest.raises(QueueClosed):
        await other.offer("closed base")


# -- start_background() ---------------------------------------------------------------------


@SHARDS
def test_start_background_runs_a_thread_worker_with_its_own_options(
    make_queue: Callable[..., DelayQueue], shards: int | None
) -> None:
    q = make_queue(shards=shards)
    seen: list[Any] = []
    worker = Worker(q, lambda task: seen.append(task.payload), **WORKER_OPTIONS)
    with worker.start_background() as handle:
        assert handle.worker is worker and handle.running
        q.offer("listened")
        wait_until(lambda: seen == ["listened"], timeout=10)
    assert not handle.running
    assert_queue_policy(q)
    with pytest.raises(ConfigError, match="async def"):
        Worker(q, async_noop)  # type: ignore[arg-type]


@SHARDS
async def test_start_background_runs_an_async_worker_with_its_own_options(
    make_async_queue: Callable[..., AsyncDelayQueue], shards: int | None
) -> None:
    q = make_async_queue(shards=shards)
    seen = asyncio.Event()

    async def handle(task: AsyncTask) -> None:
        seen.set()

    async with AsyncWorker(q, handle, **WORKER_OPTIONS).start_background() as listener:
        assert isinstance(listener.worker, AsyncWorker) and listener.running
        await q.offer("listened")
        await asyncio.wait_for(seen.wait(), 10)
    assert not listener.running
    await assert_async_queue_policy(q)
    with pytest.raises(ConfigError, match="plain function"):
        AsyncWorker(q, noop)  # type: ignore[arg-type]


# -- handlers of the wrong kind --------------------------------------------------------------


class AsyncCallable:
    async def __call__(self, task: AsyncTask) -> None:
        return None


class PlainCallable:
    def __call__(self, task: Task) -> None:
        return None


ASYNC_KINDS = {
    "async def": async_noop,
    "partial of async def": functools.partial(async_noop),
    "object with async __call__": AsyncCallable(),
}
PLAIN_KINDS = {
    "def": noop,
    "partial of def": functools.partial(noop),
    "object with __call__": PlainCallable(),
    "lambda": lambda task: None,
}


@pytest.mark.parametrize("handler", ASYNC_KINDS.values(), ids=ASYNC_KINDS.keys())
def test_thread_worker_refuses_coroutine_handlers(
    make_queue: Callable[..., DelayQueue], handler: Any
) -> None:
    q = make_queue()
    with pytest.raises(ConfigError, match=r"Worker runs plain functions in threads.*AsyncWorker"):
        Worker(q, handler)


@pytest.mark.parametrize("handler", PLAIN_KINDS.values(), ids=PLAIN_KINDS.keys())
async def test_async_worker_refuses_plain_handlers(
    make_async_queue: Callable[..., AsyncDelayQueue], handler: Any
) -> None:
    q = make_async_queue()
    with pytest.raises(ConfigError, match=r"AsyncWorker needs an async def handler.*Worker"):
        AsyncWorker(q, handler)


def test_handlers_that_are_not_callable_are_refused(
    make_queue: Callable[..., DelayQueue],
) -> None:
    with pytest.raises(ConfigError, match="callable"):
        Worker(make_queue(), "module:function")  # type: ignore[arg-type]


@pytest.mark.parametrize("handler", PLAIN_KINDS.values(), ids=PLAIN_KINDS.keys())
def test_thread_worker_runs_plain_handlers_of_every_shape(
    make_queue: Callable[..., DelayQueue], handler: Any
) -> None:
    q = make_queue()
    with Worker(q, handler).start_background():
        q.offer("x")
        wait_until(lambda: q.stats().counters.get("acked", 0) == 1, timeout=10)


@pytest.mark.parametrize("handler", ASYNC_KINDS.values(), ids=ASYNC_KINDS.keys())
async def test_async_worker_runs_coroutine_handlers_of_every_shape(
    make_async_queue: Callable[..., AsyncDelayQueue], handler: Any
) -> None:
    q = make_async_queue()
    async with AsyncWorker(q, handler).start_background():
        await q.offer("x")
        for _ in range(500):
            if (await q.stats()).counters.get("acked", 0) == 1:
                break
            await asyncio.sleep(0.02)
    assert (await q.stats()).counters.get("acked", 0) == 1


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_thread_worker_never_acks_a_coroutine_it_did_not_run(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue()
    ran: list[Any] = []

    async def close_order(task: Task) -> None:
        ran.append(task.payload)

    def decorated(task: Task) -> Any:  # what a sync decorator around an async def leaves
        return close_order(task)

    with Worker(q, decorated).start_background():
        q.offer("order 1")
        wait_until(lambda: (stats := q.stats()).ready == 0 and stats.inflight == 0, timeout=10)
    # Run correctly, or not acked: never acked unrun (a plain function returning a coroutine
    # passes the construction check, which can only look at what the handler is).
    assert ran == ["order 1"] or q.stats().counters.get("acked", 0) == 0


# -- the delayq worker command's choice ------------------------------------------------------

HANDLERS_MODULE = """
import asyncio, functools, os, threading

def record(kind):
    with open(os.environ["RECORD"], "a") as out:
        out.write(kind + "\\n")

def running_kind():
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        return "thread" if threading.current_thread() is not threading.main_thread() else "main"

def plain(task):
    record(running_kind())

async def coroutine(task):
    record(running_kind())

partial_coroutine = functools.partial(coroutine)

class Callable:
    async def __call__(self, task):
        record(running_kind())

async_callable = Callable()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("plain", "thread"),
        ("coroutine", "asyncio"),
        ("partial_coroutine", "asyncio"),
        ("async_callable", "asyncio"),
    ],
)
def test_worker_command_runs_each_handler_kind_on_its_worker(
    redis7_server: EmbeddedRedis, prefix: str, tmp_path: Path, target: str, kind: str
) -> None:
    (tmp_path / "kinds.py").write_text(HANDLERS_MODULE)
    record = tmp_path / "record.txt"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RECORD": str(record)}
    q = DelayQueue("kinds", redis7_server.url, prefix=prefix)
    q.offer("x")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq.cli",
            "worker",
            f"kinds:{target}",
            "-q",
            "kinds",
            "--redis",
            redis7_server.url,
            "--prefix",
            prefix,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: record.exists() and record.read_text(), timeout=15)
        wait_until(lambda: q.stats().counters.get("acked", 0) == 1, timeout=10)
        proc.send_signal(signal.SIGTERM)  # the command asks for the signals: a graceful stop
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        q.close()
    assert proc.returncode == 0, out
    assert record.read_text().split() == [kind]
    assert "SIGTERM received, shutting down" in out
