"""The worker runtime (``Worker`` with threads, ``AsyncWorker`` with asyncio) under real Redis.

In-process tests run either worker in a background thread through :class:`Harness` (the
``AsyncWorker`` on its own event loop there), with handlers whose behaviour a test describes
per task. Process tests run ``procs/worker_proc.py`` with ``sys.executable``: it prints
``ready <pid>``, records started and handled ids in Redis lists under the test's prefix, and
takes SIGTERM/SIGKILL like a real deployment. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import queue as queue_lib
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from delayq import (
    AsyncDelayQueue,
    AsyncWorker,
    Backoff,
    DelayQueue,
    Hooks,
    Reject,
    Retry,
    TaskState,
    Worker,
)
from delayq._core.scripts import Op
from delayq.embedded import EmbeddedRedis
from tests.conftest import BINARIES
from tests.helpers import shas, wait_until

WORKER_PROC = Path(__file__).parent / "procs" / "worker_proc.py"
KINDS = ["thread", "async"]

# -- in-process harness ---------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What the handler does with one delivery: wait ``sleep`` s, then raise or return."""

    sleep: float = 0.0
    error: BaseException | None = None
    result: Any = None


@dataclass(frozen=True)
class Call:
    id: str
    payload: Any
    attempts: int
    at: float  # time.monotonic() at handler start


@dataclass
class Harness:
    """Runs a ``Worker`` or an ``AsyncWorker`` in a background thread on one queue."""

    kind: str
    url: str
    prefix: str
    behave: Callable[[Any], Step] = lambda task: Step()
    name: str = "w"
    queue_options: dict[str, Any] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends every sleep
    # called with a client made for the queue (and whether it is asyncio), to instrument it
    wrap_client: Callable[[Any, bool], Any] | None = None

    def __post_init__(self) -> None:
        self.worker: Any = None
        self.queue: Any = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # handlers

    def _sync_handler(self, task: Any) -> Any:
        self.calls.append(Call(task.id, task.payload, task.attempts, time.monotonic()))
        step = self.behave(task)
        if step.sleep:
            self.release.wait(step.sleep)
        if step.error is not None:
            raise step.error
        return step.result

    async def _async_handler(self, task: Any) -> Any:
        self.calls.append(Call(task.id, task.payload, task.attempts, time.monotonic()))
        step = self.behave(task)
        end = time.monotonic() + step.sleep
        while time.monotonic() < end and not self.release.is_set():
            await asyncio.sleep(min(0.02, max(end - time.monotonic(), 0)))
        if step.error is not None:
            raise step.error
        return step.result

    # lifecycle

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "prefix": self.prefix,
            "safety_interval": 0.5,
            "retry_backoff": Backoff(base=0.05, max=0.05, jitter=0.0),
        }
        return {**options, **self.queue_options}

    def _main(self) -> None:
        try:
            if self.kind == "thread":
                client = redis.Redis.from_url(self.url) if self.wrap_client else None
                if client is not None and self.wrap_client is not None:
                    self.wrap_client(client, False)
                self.queue = DelayQueue(self.name, client or self.url, **self._options())
                try:
                    self.worker = Worker(
                        self.queue, self._sync_handler, handle_signals=False, **self.worker_options
                    )
                    self.worker.run()
                finally:
                    self.queue.close()
                    if client is not None:
                        client.close()
            else:
                asyncio.run(self._async_main())
        except BaseException as exc:  # reported by stop(), not lost in the thread
            self.error = exc

    async def _async_main(self) -> None:
        self._loop = asyncio.get_running_loop()
        client = aredis.Redis.from_url(self.url) if self.wrap_client else None
        if client is not None and self.wrap_client is not None:
            self.wrap_client(client, True)
        self.queue = AsyncDelayQueue(self.name, client or self.url, **self._options())
        try:
            self.worker = AsyncWorker(
                self.queue, self._async_handler, handle_signals=False, **self.worker_options
            )
            await self.worker.run()
        finally:
            await self.queue.close()
            if client is not None:
                await client.aclose()

    def start(self) -> Harness:
        self._thread = threading.Thread(target=self._main, name=f"test-{self.kind}-worker")
        self._thread.start()
        wait_until(
            lambda: (
                self.error is not None
                or (self.worker is not None and self.worker.health().state == "running")
            ),
            timeout=5,
        )
        assert self.error is None, self.error
        return self

    def stop(self, timeout: float = 15.0) -> float:
        """Ask for a graceful stop; returns how long ``run()`` took to return."""
        assert self._thread is not None and self.worker is not None
        begun = time.monotonic()
        if self.kind == "thread":
            self.worker.stop()
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(timeout)
        took = time.monotonic() - begun
        assert not self._thread.is_alive(), f"worker did not stop within {timeout}s"
        if self.error is not None:
            raise self.error
        return took

    def close(self) -> None:
        self.release.set()
        if self._thread is not None and self._thread.is_alive():
            self.stop()

    def health(self) -> Any:
        return self.worker.health()

    def attempts_of(self, payload: Any) -> list[int]:
        return [c.attempts for c in self.calls if c.payload == payload]


@pytest.fixture
def harness(prefix: str) -> Iterator[Callable[..., Harness]]:
    """Start workers in background threads; every one is stopped at the end of the test."""
    made: list[Harness] = []

    def make(kind: str, url: str, behave: Callable[[Any], Step], **options: Any) -> Harness:
        h = Harness(
            kind,
            url,
            prefix,
            behave,
            queue_options=options.pop("queue_options", {}),
            wrap_client=options.pop("wrap_client", None),
            worker_options={"grace": 2.0, **options},
        )
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.close()


@pytest.fixture
def inspect7(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[DelayQueue]:
    """A plain queue on the Redis 7 server, for offering and looking (name ``w``)."""
    q = DelayQueue("w", redis7_server.url, prefix=prefix)
    yield q
    q.close()


def counts(h: Harness) -> tuple[int, int, int, int]:
    health = h.health()
    return (health.processed, health.succeeded, health.failed, health.dead)


def done(q: DelayQueue) -> bool:
    s = q.stats()
    return s.delayed == s.ready == s.inflight == 0


def empty_counts(q: DelayQueue) -> tuple[int, ...]:
    s = q.stats()
    return (s.delayed, s.ready, s.inflight, s.dead)


# -- handler outcomes -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_return_acks_raise_retries_with_backoff_then_dead_letters(
    kind: str,
    redis_server: EmbeddedRedis,
    make_queue: Callable[..., DelayQueue],
    harness: Callable[..., Harness],
) -> None:
    """A handler that returns acks its task; one that raises has it retried after the backoff
    (0.2 s, then 0.4 s) and dead-lettered after max_attempts=3 with the error text."""
    q = make_queue("w")

    def behave(task: Any) -> Step:
        if task.payload == "bad":
            return Step(error=ValueError(f"boom on attempt {task.attempts}"))
        return Step(result="fine")

    ok_id, bad_id = q.offer("ok"), q.offer("bad")
    h = harness(
        kind,
        redis_server.url,
        behave,
        concurrency=2,
        queue_options={"max_attempts": 3, "retry_backoff": Backoff(base=0.2, max=5, jitter=0)},
    )
    wait_until(lambda: q.stats().dead == 1, timeout=10)
    wait_until(lambda: counts(h) == (4, 1, 3, 1), timeout=5)  # counters follow the outcome
    assert h.attempts_of("ok") == [1]
    assert h.attempts_of("bad") == [1, 2, 3]
    starts = [c.at for c in h.calls if c.payload == "bad"]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 0.2 - 0.03 and gaps[1] >= 0.4 - 0.03, gaps  # exponential backoff
    assert gaps[1] < 2.0, gaps
    [dead] = q.dead()
    assert dead.id == bad_id and dead.attempts == 3
    assert dead.error is not None and "ValueError: boom on attempt 3" in dead.error
    assert q.get(ok_id) is None  # acked: gone
    counters = q.stats().counters
    assert counters["acked"] == 1 and counters["retried"] == 2
    assert counters["dead_lettered"] == 1
    h.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_retry_with_delay_and_reject(
    kind: str,
    redis_server: EmbeddedRedis,
    make_queue: Callable[..., DelayQueue],
    harness: Callable[..., Harness],
) -> None:
    """``Retry(delay=0.3)`` delivers the task again no sooner than 0.3 s later, with
    attempts + 1; ``Reject(reason)`` dead-letters at once, whatever max_attempts says."""
    q = make_queue("w")

    def behave(task: Any) -> Step:
        if task.payload == "later" and task.attempts == 1:
            return Step(error=Retry(delay=0.3, reason="not yet"))
        if task.payload == "refuse":
            return Step(error=Reject("not for us"))
        return Step()

    later_id, refuse_id = q.offer("later"), q.offer("refuse")
    h = harness(kind, redis_server.url, behave, queue_options={"max_attempts": 10})
    wait_until(lambda: done(q) and q.stats().dead == 1, timeout=10)
    assert h.attempts_of("later") == [1, 2]
    first, second = (c.at for c in h.calls if c.payload == "later")
    assert 0.3 - 0.03 <= second - first < 2.0
    assert h.attempts_of("refuse") == [1]
    [dead] = q.dead()
    assert dead.id == refuse_id and dead.attempts == 1
    assert dead.error == "rejected: not for us"
    assert q.get(later_id) is None
    counters = q.stats().counters
    assert counters["acked"] == 1 and counters["retried"] == 1 and counters["dead_lettered"] == 1
    wait_until(lambda: counts(h) == (3, 1, 2, 1), timeout=5)  # counters follow the outcome
    h.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_hanging_handler_is_abandoned_retried_and_others_go_on(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,
    harness: Callable[..., Harness],
) -> None:
    """With concurrency 1 and timeout 0.5 s, a handler hanging for 30 s is given up after the
    timeout: its task is retried (attempts 2), the other tasks are processed meanwhile."""
    q = inspect7
    failures: list[tuple[str, BaseException | None]] = []

    def behave(task: Any) -> Step:
        if task.payload == "hang" and task.attempts == 1:
            return Step(sleep=30)
        return Step()

    hang_id = q.offer("hang")
    h = harness(
        kind,
        redis7_server.url,
        behave,
        concurrency=1,
        prefetch=0,
        timeout=0.5,
        hooks=Hooks(on_failure=lambda task, exc: failures.append((task.id, exc))),
    )
    wait_until(lambda: len(h.calls) == 1, timeout=5)
    others = q.offer_many([(f"other-{i}", 0) for i in range(5)])
    wait_until(lambda: done(q), timeout=10)
    assert h.attempts_of("hang") == [1, 2]
    assert sorted(c.id for c in h.calls if c.payload != "hang") == sorted(others)
    assert [task_id for task_id, _ in failures] == [hang_id]
    assert isinstance(failures[0][1], TimeoutError)
    health = h.health()
    assert health.timed_out == 1 and health.failed == 1 and health.succeeded == 6
    counters = q.stats().counters
    assert counters["retried"] == 1 and counters["acked"] == 6 and counters["delivered"] == 7
    h.release.set()  # let a hung thread end, so that stop() does not wait for it
    h.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_heartbeat_keeps_long_and_buffered_tasks_leased(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,
    harness: Callable[..., Harness],
) -> None:
    """visibility_timeout 1 s, handlers of 2.5 s, and a third task fetched ahead that waits
    2.5 s in the buffer: the heartbeat keeps all three leased; none is delivered twice."""
    q = inspect7
    ids = q.offer_many([("long", 0), ("long", 0), ("short", 0)])

    def behave(task: Any) -> Step:
        return Step(sleep=2.5 if task.payload == "long" else 0)

    h = harness(
        kind,
        redis7_server.url,
        behave,
        concurrency=2,
        prefetch=1,
        queue_options={"visibility_timeout": 1.0},
    )
    wait_until(lambda: done(q), timeout=10)
    assert sorted(c.id for c in h.calls) == sorted(ids)
    assert all(c.attempts == 1 for c in h.calls)
    counters = q.stats().counters
    assert counters["delivered"] == 3 and counters["acked"] == 3
    assert counters.get("lease_expired", 0) == 0
    assert h.health().succeeded == 3
    h.stop()


# -- hooks and health -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_are_called_and_a_raising_hook_breaks_nothing(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,
    harness: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """on_start / on_success / on_failure / on_dead get the task (and result, duration or the
    exception); every hook raising does not stop the worker, the acks or the retries."""
    caplog.set_level(logging.ERROR, logger="delayq.worker")
    q = inspect7
    seen: list[tuple[Any, ...]] = []

    def hook(name: str) -> Callable[..., None]:
        def record(task: Any, *rest: Any) -> None:
            seen.append((name, task.payload, task.attempts, *rest))
            raise RuntimeError(f"hook {name} is broken")

        return record

    hooks = Hooks(
        on_start=hook("start"),
        on_success=hook("success"),
        on_failure=hook("failure"),
        on_dead=hook("dead"),
    )

    def behave(task: Any) -> Step:
        if task.payload == "bad":
            return Step(error=KeyError("nope"))
        return Step(result=f"result of {task.payload}")

    q.offer_many([("a", 0), ("b", 0), ("bad", 0)])
    h = harness(kind, redis7_server.url, behave, hooks=hooks, queue_options={"max_attempts": 2})
    wait_until(lambda: done(q) and q.stats().dead == 1, timeout=10)
    wait_until(lambda: len(seen) == 4 + 2 + 2 + 1, timeout=5)  # hooks run after the outcome
    by_name = Counter(entry[0] for entry in seen)
    assert by_name == {"start": 4, "success": 2, "failure": 2, "dead": 1}
    successes = sorted(e for e in seen if e[0] == "success")
    assert [(e[1], e[3]) for e in successes] == [("a", "result of a"), ("b", "result of b")]
    assert all(isinstance(e[4], float) and e[4] >= 0 for e in successes)
    failures = [e for e in seen if e[0] == "failure"]
    assert [(e[1], e[2]) for e in failures] == [("bad", 1), ("bad", 2)]
    assert all(isinstance(e[3], KeyError) for e in failures)
    [dead] = [e for e in seen if e[0] == "dead"]
    assert dead[1:3] == ("bad", 2) and isinstance(dead[3], KeyError)
    assert q.stats().counters["acked"] == 2
    assert any("hook" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    assert h.health().state == "running"
    h.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_health_and_health_file(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,
    harness: Callable[..., Harness],
    tmp_path: Path,
) -> None:
    """health() and the JSON health file: state, alive, running handlers, counters and
    progress times, from running to stopped."""
    q = inspect7
    path = tmp_path / "health.json"
    gate = threading.Event()

    def behave(task: Any) -> Step:
        if task.payload == "gated":
            return Step(sleep=10 if not gate.is_set() else 0)
        return Step()

    h = harness(kind, redis7_server.url, behave, concurrency=2, health_file=str(path))
    wait_until(path.exists, timeout=5)
    doc = json.loads(path.read_text())
    expected = {
        "state", "alive", "running", "processed", "succeeded", "failed", "dead", "timed_out",
        "redis_errors", "seconds_since_progress", "seconds_since_fetch", "pid", "updated_at",
        "internal_errors", "loop_restarts", "reason", "unknown_queues",
    }  # fmt: skip
    assert set(doc) == expected
    assert doc["state"] == "running" and doc["alive"] is True and doc["pid"] == os.getpid()
    assert abs(doc["updated_at"] - time.time()) < 5

    q.offer_many([(i, 0) for i in range(3)])
    wait_until(lambda: h.health().succeeded == 3, timeout=5)
    q.offer("gated")
    wait_until(lambda: h.health().running == 1, timeout=5)
    health = h.health()
    assert health.alive and health.state == "running"
    assert health.processed == 3 and health.failed == 0 and health.redis_errors == 0
    assert health.seconds_since_fetch < 2
    wait_until(lambda: json.loads(path.read_text())["running"] == 1, timeout=5)
    assert json.loads(path.read_text())["processed"] == 3

    gate.set()
    h.release.set()
    wait_until(lambda: h.health().succeeded == 4, timeout=5)
    assert h.health().seconds_since_progress < 2
    h.stop()
    health = h.health()
    assert health.state == "stopped" and not health.alive and health.running == 0
    doc = json.loads(path.read_text())
    assert doc["state"] == "stopped" and doc["alive"] is False and doc["succeeded"] == 4


@pytest.mark.slow
def test_health_stays_alive_while_all_slots_run_long_handlers(
    redis7_server: EmbeddedRedis, inspect7: DelayQueue, harness: Callable[..., Harness]
) -> None:
    """Both workers, each with its only slot busy for 6 s (safety interval 0.1 s, so `alive`
    allows 5.3 s without a fetch): a busy worker is alive, a supervisor must not kill it."""
    q = inspect7
    q.offer_many([("long", 0), ("long", 0)])
    options: dict[str, Any] = {
        "concurrency": 1,
        "prefetch": 0,
        "queue_options": {"safety_interval": 0.1, "visibility_timeout": 30},
    }
    workers = [
        harness(kind, redis7_server.url, lambda task: Step(sleep=6.5), **options) for kind in KINDS
    ]
    wait_until(lambda: all(w.health().running == 1 for w in workers), timeout=5)
    deadline = time.monotonic() + 6.0
    dead_at: list[tuple[str, float]] = []
    while time.monotonic() < deadline and not dead_at:
        dead_at = [
            (w.kind, w.health().seconds_since_fetch) for w in workers if not w.health().alive
        ]
        time.sleep(0.1)
    for w in workers:
        w.release.set()
    assert dead_at == [], f"busy workers reported not alive: {dead_at}"


# -- graceful stop in process ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "thread",
        "async",
    ],
)
def test_stop_returns_once_running_handlers_finish(
    kind: str, redis7_server: EmbeddedRedis, inspect7: DelayQueue, harness: Callable[..., Harness]
) -> None:
    """grace 5 s, two handlers of 0.4 s running, one task buffered: stop() hands the buffered
    one back at once and returns as soon as the two finish, not after the grace period."""
    q = inspect7
    q.offer_many([(i, 0) for i in range(3)])
    h = harness(
        kind,
        redis7_server.url,
        lambda task: Step(sleep=0.4),
        concurrency=2,
        prefetch=1,
        grace=5.0,
        queue_options={"visibility_timeout": 60},
    )
    wait_until(lambda: h.health().running == 2, timeout=5)
    took = h.stop()
    stats = q.stats()
    assert (stats.ready, stats.inflight, stats.counters["acked"]) == (1, 0, 2)
    assert took < 2.0, f"stop took {took:.2f}s with handlers of 0.4s and grace 5s"


@pytest.mark.parametrize(
    "kind",
    [
        "thread",
        "async",
    ],
)
def test_stop_does_not_wait_for_an_abandoned_handler(
    kind: str, redis7_server: EmbeddedRedis, inspect7: DelayQueue, harness: Callable[..., Harness]
) -> None:
    """A handler hung past its timeout was given up (task retried): at stop, with grace 4 s,
    the worker has nothing running and returns at once."""
    q = inspect7

    def behave(task: Any) -> Step:
        return Step(sleep=30 if task.attempts == 1 else 0)

    task_id = q.offer("hang")
    h = harness(kind, redis7_server.url, behave, concurrency=1, timeout=0.3, grace=4.0)
    wait_until(lambda: h.attempts_of("hang") == [1, 2], timeout=5)
    wait_until(lambda: done(q), timeout=5)
    assert h.health().running == 0
    took = h.stop()
    assert q.get(task_id) is None
    assert took < 1.5, f"stop took {took:.2f}s with no handler running"


class _SlowReplies:
    """Wraps a client's ``execute_command``: replies of script ``op`` arrive 0.5 s after the
    server ran it (a slow network), and ``replied`` is set while such a reply is on its way.
    FETCH replies are slowed only when they lease tasks."""

    def __init__(self, client: Any, is_async: bool, op: Op = Op.FETCH) -> None:
        self.replied = threading.Event()
        slow = shas(op)
        original = client.execute_command

        def slowed(args: tuple[Any, ...], reply: Any) -> bool:
            if args[0] != "EVALSHA" or args[1] not in slow:
                return False
            return op is not Op.FETCH or (reply is not None and len(reply) > 3)  # it leased tasks

        if is_async:

            async def slow_async(*args: Any, **options: Any) -> Any:
                reply = await original(*args, **options)
                if slowed(args, reply):
                    self.replied.set()
                    await asyncio.sleep(0.5)
                return reply

            client.execute_command = slow_async
        else:

            def slow_sync(*args: Any, **options: Any) -> Any:
                reply = original(*args, **options)
                if slowed(args, reply):
                    self.replied.set()
                    time.sleep(0.5)
                return reply

            client.execute_command = slow_sync


@pytest.mark.parametrize(
    "kind",
    [
        "thread",
        "async",
    ],
)
def test_stop_while_a_fetch_reply_is_in_transit_hands_everything_back(
    kind: str, redis7_server: EmbeddedRedis, inspect7: DelayQueue, harness: Callable[..., Harness]
) -> None:
    """stop() arrives while a FETCH that leased tasks has not answered yet (its reply slowed to
    0.5 s, as on a slow network): those tasks are handed back too; none is left to wait for its
    60 s visibility timeout."""
    q = inspect7
    q.offer_many([(i, 0) for i in range(5)])
    slow: list[_SlowReplies] = []
    h = harness(
        kind,
        redis7_server.url,
        lambda task: Step(),
        concurrency=2,
        wrap_client=lambda client, is_async: slow.append(_SlowReplies(client, is_async)),
        queue_options={"visibility_timeout": 60},
    )
    wait_until(lambda: bool(slow) and slow[0].replied.is_set(), timeout=5)
    h.stop()
    stats = q.stats()
    assert stats.inflight == 0, f"{stats.inflight} tasks left leased by a stopped worker"
    assert stats.ready + stats.counters.get("acked", 0) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_heartbeat_does_not_report_acked_tasks_as_lost(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,
    harness: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ack whose reply takes 0.5 s (a slow network) while the heartbeat runs every 0.2 s:
    the task was done and acked, so no lease-lost warning may be logged about it."""
    caplog.set_level(logging.WARNING, logger="delayq.worker")
    q = inspect7
    slow: list[_SlowReplies] = []
    h = harness(
        kind,
        redis7_server.url,
        lambda task: Step(),
        concurrency=1,
        wrap_client=lambda client, is_async: slow.append(_SlowReplies(client, is_async, Op.ACK)),
        queue_options={"visibility_timeout": 0.6},
    )
    task_id = q.offer("job")
    wait_until(lambda: done(q) and q.stats().counters.get("acked") == 1, timeout=5)
    wait_until(lambda: h.health().succeeded == 1, timeout=5)
    wait_until(lambda: h.worker._ledger.held() == 0, timeout=5)  # the slowed ack reply has landed
    h.stop()
    assert q.stats().counters.get("lease_expired", 0) == 0
    lost = [r.getMessage() for r in caplog.records if task_id in r.getMessage()]
    assert lost == [], lost


# -- worker processes -----------------------------------------------------------------------


class WorkerProc:
    """A worker subprocess; a thread reads its output so every wait on it is bounded."""

    def __init__(self, url: str, prefix: str, queue: str, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-u", str(WORKER_PROC), url, prefix, queue, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output: list[str] = []
        self._lines: queue_lib.Queue[str] = queue_lib.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self._lines.put(raw.decode(errors="replace").rstrip("\n"))

    def expect(self, text: str, timeout: float = 20.0) -> str:
        """The next output line containing ``text``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue_lib.Empty:
                break
            self.output.append(line)
            if text in line:
                return line
        raise AssertionError(
            f"worker printed no {text!r} line within {timeout}s "
            f"(exit code {self.popen.poll()}); output so far: {self.output}"
        )

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        return self.popen.wait(timeout)

    def cleanup(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., WorkerProc]]:
    """Start worker processes; every one is killed at the end of the test, whatever happens."""
    started: list[WorkerProc] = []

    def start(url: str, prefix: str, **options: Any) -> WorkerProc:
        """``options`` become the script's flags: ``kind="async"`` is ``--kind async``,
        ``record=True`` is ``--record``."""
        args = ["--max-seconds", "60"]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            args += [flag] if value is True else [flag, str(value)]
        proc = WorkerProc(url, prefix, "w", *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


@pytest.fixture
def client7(redis7_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis7_server.url)
    yield c
    c.close()


def handled(client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(f"{prefix}:handled", 0, -1)]


def started_ids(client: redis.Redis, prefix: str) -> list[str]:
    return [raw.decode() for raw in client.lrange(f"{prefix}:started", 0, -1)]


def drain_in_process(url: str, prefix: str, name: str, expected: int, timeout: float) -> float:
    """Run a recording thread Worker until ``expected`` handled records exist; its duration."""
    client = redis.Redis.from_url(url)
    pid = os.getpid()

    def handler(task: Any) -> None:
        record = {"id": task.id, "attempts": task.attempts, "pid": pid}
        client.rpush(f"{prefix}:handled", json.dumps(record))

    began = time.monotonic()
    with DelayQueue(name, url, prefix=prefix, visibility_timeout=60) as q:
        worker = Worker(q, handler, concurrency=8, handle_signals=False)
        runner = threading.Thread(target=worker.run)
        runner.start()
        try:
            wait_until(lambda: client.llen(f"{prefix}:handled") >= expected, timeout=timeout)
            wait_until(lambda: done(q), timeout=5)
        finally:
            worker.stop()
            runner.join(10)
    client.close()
    return time.monotonic() - began


@pytest.mark.parametrize(("kind", "sleep", "grace"), [
    ("thread", "0.8", "3"),
    ("async", "0.8", "3"),
    ("thread", "30", "0.5"),
    ("async", "30", "0.5"),
], ids=["thread-finish", "async-finish", "thread-cutoff", "async-cutoff"])  # fmt: skip
def test_sigterm_mid_task_finishes_or_hands_back_and_loses_nothing(
    kind: str,
    sleep: str,
    grace: str,
    redis7_server: EmbeddedRedis,
    client7: redis.Redis,
    prefix: str,
    spawn: Callable[..., WorkerProc],
) -> None:
    """SIGTERM while 4 handlers run and 4 tasks wait in the prefetch buffer (visibility 60 s):
    the buffered tasks are back in the queue at once; the running ones finish within the grace
    period (0.8 s handlers, grace 3 s) or are handed back when it ends (30 s handlers, grace
    0.5 s); the process exits 0; a second worker then handles every task, none twice, long
    before any visibility timeout."""
    url, n = redis7_server.url, 20
    proc = spawn(
        url,
        prefix,
        kind=kind,
        concurrency=4,
        prefetch=4,
        visibility=60,
        sleep=sleep,
        grace=grace,
        record=True,
    )
    proc.expect("ready")
    with DelayQueue("w", url, prefix=prefix) as q:
        ids = q.offer_many([(i, 0) for i in range(n)])
        wait_until(lambda: q.stats().inflight == 8 and len(started_ids(client7, prefix)) == 4)
        running = set(started_ids(client7, prefix))
        proc.signal(signal.SIGTERM)
        # Buffered tasks go back at once: only the 4 running ones stay leased.
        wait_until(lambda: q.stats().inflight <= 4, timeout=1.0)
        assert proc.wait(float(grace) + 5) == 0
        proc.expect("stopped")
        stats = q.stats()
        assert stats.inflight == 0, "a stopped worker left tasks leased"
        first = handled(client7, prefix)
        if sleep == "30":
            assert first == []  # cut off by the grace period, handed back
            assert stats.ready == n
            assert all(q.get(i).attempts == 0 for i in running)  # type: ignore[union-attr]
        else:
            assert {r["id"] for r in first} == running  # finished within the grace period
            assert stats.ready == n - len(running)

        took = drain_in_process(url, prefix, "w", n, timeout=15)
        assert took < 10, "tasks waited for their visibility timeout"
        records = handled(client7, prefix)
        per_id = Counter(r["id"] for r in records)
        assert set(per_id) == set(ids), "tasks lost"
        assert max(per_id.values()) == 1, "a task was handled twice"
        assert empty_counts(q) == (0, 0, 0, 0)
        assert q.stats().counters.get("lease_expired", 0) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_second_signal_exits_at_once_and_tasks_come_back_later(
    kind: str,
    redis7_server: EmbeddedRedis,
    client7: redis.Redis,
    prefix: str,
    spawn: Callable[..., WorkerProc],
) -> None:
    """A first SIGTERM starts a graceful stop (grace 30 s, handler 30 s); a second one ends the
    process at once (exit 128 + 15). What it held comes back after the 1 s lease."""
    url = redis7_server.url
    proc = spawn(
        url,
        prefix,
        kind=kind,
        concurrency=1,
        prefetch=0,
        visibility=1,
        sleep=30,
        grace=30,
        record=True,
    )
    proc.expect("ready")
    with DelayQueue("w", url, prefix=prefix) as q:
        task_id = q.offer("job")
        wait_until(lambda: started_ids(client7, prefix) == [task_id])
        proc.signal(signal.SIGTERM)
        proc.expect("SIGTERM received", timeout=5)
        signalled = time.monotonic()
        proc.signal(signal.SIGTERM)
        assert proc.wait(5) == 128 + signal.SIGTERM
        assert time.monotonic() - signalled < 2.0
        assert handled(client7, prefix) == []
        again = q.poll(timeout=5)
        assert again is not None and again.id == task_id and again.attempts == 2
        q.ack(again)


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_mid_task_is_redelivered_after_visibility_timeout(
    kind: str,
    redis7_server: EmbeddedRedis,
    client7: redis.Redis,
    prefix: str,
    spawn: Callable[..., WorkerProc],
) -> None:
    """A worker SIGKILLed in the middle of a handler: its task stays leased until the 1 s
    visibility timeout runs out (not before), then another consumer gets it, attempts 2."""
    url = redis7_server.url
    proc = spawn(url, prefix, kind=kind, concurrency=2, visibility=1, sleep=30, record=True)
    proc.expect("ready")
    with DelayQueue("w", url, prefix=prefix) as q:
        task_id = q.offer("job")
        wait_until(lambda: started_ids(client7, prefix) == [task_id])
        proc.signal(signal.SIGKILL)
        killed = time.monotonic()
        assert proc.wait(5) == -signal.SIGKILL
        info = q.get(task_id)
        assert info is not None and info.state is TaskState.INFLIGHT
        assert info.lease_expires_at is not None
        again = q.poll(timeout=5)
        assert again is not None and again.id == task_id and again.attempts == 2
        assert time.monotonic() - killed < 4
        assert again.delivered_at >= info.lease_expires_at, "redelivered before lease expiry"
        q.ack(again)
        assert q.stats().counters["lease_expired"] == 1


@pytest.mark.slow
def test_redis_restart_while_workers_run(prefix: str, spawn: Callable[..., WorkerProc]) -> None:
    """A thread worker and an async worker process consume while Redis (AOF, fsync always) is
    SIGKILLed and started again on the same port: both resume by themselves, every task is
    handled, and duplicates stay within what was leased at the crash (at-least-once)."""
    server = EmbeddedRedis(BINARIES[0][1], aof=True).start()
    client = redis.Redis.from_url(server.url)
    try:
        procs = [
            spawn(
                server.url,
                prefix,
                kind=kind,
                concurrency=4,
                prefetch=4,
                visibility=3,
                sleep=0.01,
                record=True,
            )
            for kind in KINDS
        ]
        pids = [int(p.expect("ready").split()[1]) for p in procs]
        with DelayQueue("w", server.url, prefix=prefix, reconnect_timeout=10) as q:
            ids = q.offer_many([(i, i / 200) for i in range(400)])  # due over 2 s
            wait_until(lambda: client.llen(f"{prefix}:handled") >= 100, timeout=10)
            server.kill()
            for p in procs:  # each notices by itself
                p.expect("retrying", timeout=10)
            server.start()
            mark = client.llen(f"{prefix}:handled")
            ids += q.offer_many([(i, i / 200) for i in range(400, 600)])
            wait_until(
                lambda: len({r["id"] for r in handled(client, prefix)}) >= 600,
                timeout=30,
                interval=0.1,
            )
            wait_until(lambda: done(q), timeout=10)
            records = handled(client, prefix)
            per_id = Counter(r["id"] for r in records)
            assert set(per_id) == set(ids), "tasks lost"
            duplicates = sum(k - 1 for k in per_id.values())
            assert duplicates <= 2 * 8, f"{duplicates} duplicates beyond the leased tasks"
            assert q.stats().dead == 0
            after = {r["pid"] for r in records[mark:]}
            assert after == set(pids), "a worker did not resume after the restart"
            assert all(p.popen.poll() is None for p in procs)
        for p in procs:
            p.signal(signal.SIGTERM)
        assert [p.wait(10) for p in procs] == [0, 0]
    finally:
        client.close()
        server.stop()


@pytest.mark.slow
def test_four_worker_processes_deliver_no_task_twice(
    redis7_server: EmbeddedRedis,
    client7: redis.Redis,
    prefix: str,
    spawn: Callable[..., WorkerProc],
) -> None:
    """Two thread and two async worker processes (concurrency 8 each) on one queue: 2,000
    tasks, each handled exactly once, by several processes."""
    url, n = redis7_server.url, 2000
    procs = [
        spawn(url, prefix, kind=kind, concurrency=8, record=True)
        for kind in ("thread", "async", "thread", "async")
    ]
    for p in procs:
        p.expect("ready")
    with DelayQueue("w", url, prefix=prefix) as q:
        ids = q.offer_many([(i, i / 2000) for i in range(n)])
        wait_until(lambda: client7.llen(f"{prefix}:handled") >= n, timeout=30, interval=0.05)
        wait_until(lambda: done(q), timeout=5)
        for p in procs:
            p.signal(signal.SIGTERM)
        assert [p.wait(10) for p in procs] == [0] * 4
        records = handled(client7, prefix)
        per_id = Counter(r["id"] for r in records)
        assert [i for i, k in per_id.items() if k > 1] == [], "tasks handled twice"
        assert set(per_id) == set(ids) and len(records) == n
        assert all(r["attempts"] == 1 for r in records)
        assert len({r["pid"] for r in records}) >= 3, "the work was not shared"
        counters = q.stats().counters
        assert counters["delivered"] == counters["acked"] == n


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_with_100_tasks_in_flight_loses_none(
    kind: str,
    redis7_server: EmbeddedRedis,
    client7: redis.Redis,
    prefix: str,
    spawn: Callable[..., WorkerProc],
) -> None:
    """A worker holding 100 tasks (50 running 0.5 s handlers, 50 prefetched) gets SIGTERM:
    the 50 running finish, the 50 buffered go back at once, nothing stays leased, and every
    one of the 300 tasks is handled exactly once in the end, long before the 60 s lease."""
    url, n = redis7_server.url, 300
    proc = spawn(
        url,
        prefix,
        kind=kind,
        concurrency=50,
        prefetch=50,
        visibility=60,
        sleep=0.5,
        grace=3,
        record=True,
    )
    proc.expect("ready")
    with DelayQueue("w", url, prefix=prefix) as q:
        ids = q.offer_many([(i, 0) for i in range(n)])
        wait_until(lambda: q.stats().inflight == 100, timeout=5)
        proc.signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        stats = q.stats()
        assert stats.inflight == 0, f"{stats.inflight} tasks left waiting for their lease"
        first = handled(client7, prefix)
        assert {r["id"] for r in first} == set(started_ids(client7, prefix))
        assert stats.ready == n - len(first)

        took = drain_in_process(url, prefix, "w", n, timeout=20)
        assert took < 15
        per_id = Counter(r["id"] for r in handled(client7, prefix))
        assert set(per_id) == set(ids), "tasks lost"
        assert max(per_id.values()) == 1, "a task was handled twice"
        assert empty_counts(q) == (0, 0, 0, 0)


@pytest.mark.parametrize("exit_by", [SystemExit(3), KeyboardInterrupt()], ids=repr)
def test_an_async_worker_survives_a_handler_that_exits(
    redis_server: Any, prefix: str, exit_by: BaseException
) -> None:
    """The worker never dies from a task, not even sys.exit() (as the thread Worker): raised
    out of a handler's task, SystemExit ended asyncio.run, the worker and every handler
    beside it, the task left leased until its visibility timeout."""
    attempts: list[int] = []

    async def main() -> None:
        q = AsyncDelayQueue("exits", redis_server.url, prefix=prefix)
        again = asyncio.Event()

        async def handler(task: Any) -> None:
            attempts.append(task.attempts)
            if task.attempts == 1:
                raise exit_by  # say, a library calling sys.exit() on bad input
            again.set()

        worker = AsyncWorker(q, handler, concurrency=1, retry_backoff=Backoff(base=0.05, max=0.05))
        handle = worker.start_background()
        await q.offer("x")
        try:
            await asyncio.wait_for(again.wait(), 15)
            assert handle.running
        finally:
            await handle.stop()
            await q.close()

    asyncio.run(main())
    assert attempts == [1, 2]
