"""AsyncWorker: runs ``async def`` handlers on delayed queues, and never dies from a task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._async.queue import AsyncDelayQueue, AsyncTask
from .._core.handling import Verdict, outcome_of
from .._core.models import Backoff
from ..exceptions import DelayqError, LeaseLost
from ..metrics._base import WorkerRecorder
from .common import (
    Hooks,
    WorkerBase,
    WorkerOptions,
    call_hook,
    log_outcome,
)

log = logging.getLogger("delayq.worker")

Handler = Callable[[AsyncTask], Awaitable[Any]]


class AsyncWorker(WorkerBase):
    """Runs ``handler`` for every due task of ``queues`` with up to ``concurrency`` at once.

    Return from the handler = ack. Raise = retry after the queue's backoff (dead-lettered after
    ``max_attempts``); raise :class:`~delayq.Retry` or :class:`~delayq.Reject` to choose. Leases
    are extended while a handler runs; a handler running past ``timeout`` is cancelled and its
    task retried. ``run()`` returns after :meth:`stop` (or SIGTERM/SIGINT): fetching stops,
    running handlers get ``grace`` seconds, and every task not finished is handed back at once.

    ``visibility_timeout``, ``max_attempts`` and ``retry_backoff``, when given, override the
    queues' own lease and retry policy for the tasks this worker handles. ``metrics``: a
    recorder such as :class:`delayq.metrics.WorkerMetrics` (Prometheus); none by default.
    """

    def __init__(
        self,
        queues: AsyncDelayQueue | Sequence[AsyncDelayQueue],
        handler: Handler,
        *,
        concurrency: int = 8,
        timeout: float | None = None,
        grace: float = 30.0,
        prefetch: int | None = None,
        health_file: str | None = None,
        handle_signals: bool = True,
        hooks: Hooks | None = None,
        visibility_timeout: float | None = None,
        max_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
        metrics: WorkerRecorder | None = None,
    ) -> None:
        self._setup(
            [queues] if isinstance(queues, AsyncDelayQueue) else list(queues),
            handler,
            WorkerOptions.build(
                1 if isinstance(queues, AsyncDelayQueue) else len(queues),
                concurrency, timeout, grace, prefetch, health_file,
            ),
            handle_signals,
            hooks,
            (visibility_timeout, max_attempts, retry_backoff),
            metrics,
        )  # fmt: skip
        self._ack_ready = asyncio.Event()
        self._space = asyncio.Event()  # set when a handler finishes
        self._stopping = asyncio.Event()

    # -- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler or another task)."""
        self._stopping.set()

    async def run(self) -> None:
        """Work until stopped; then shut down gracefully and return."""
        loop = asyncio.get_running_loop()
        installed = self._install_signals(loop)
        self._state = "running"
        self._metrics.worker_started([q.name for q in self._queues])
        buffers = [asyncio.Queue[AsyncTask]() for _ in self._queues]
        helpers = [
            asyncio.create_task(self._ack_loop(), name="delayq-worker-ack"),
            asyncio.create_task(self._heartbeat_loop(), name="delayq-worker-heartbeat"),
            asyncio.create_task(self._health_loop(), name="delayq-worker-health"),
        ]
        fetchers = [
            asyncio.create_task(self._fetch_loop(i, buffers[i]), name=f"delayq-worker-fetch-{i}")
            for i in range(len(self._queues))
        ]
        runners = [
            asyncio.create_task(self._run_loop(i, buffers[i]), name=f"delayq-worker-run-{i}")
            for i in range(len(self._queues))
            for _ in range(self._options.slots)
        ]
        log.info(
            "delayq worker started: queues=%s concurrency=%d",
            ",".join(q.name for q in self._queues), self._options.concurrency,
        )  # fmt: skip
        try:
            await self._stopping.wait()
        finally:
            self._state = "stopping"
            await self._shutdown(fetchers, runners, buffers)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._flush_acks()
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._state = "stopped"
            self._metrics.worker_stopped([q.name for q in self._queues])
            self._write_health()
            log.info("delayq worker stopped: processed=%d", self._counters.processed)

    # -- loops ------------------------------------------------------------------------------

    async def _fetch_loop(self, index: int, buffer: asyncio.Queue[AsyncTask]) -> None:
        queue = self._queues[index]
        backoff = 0.05
        while not self._stopping.is_set():
            running = sum(1 for key in self._running if key[0] == index)
            space = self._options.room(buffer.qsize() + running)
            if space <= 0:
                self._counters.last_fetch = time.monotonic()  # full, not stuck
                self._metrics.heartbeat(queue.name)
                await self._wait_for_space()
                continue
            try:
                tasks = await queue.poll_many(space, timeout=min(queue._safety_s, 0.5))
                backoff = 0.05
            except DelayqError as exc:  # Redis away or refusing: keep trying, never die
                self._counters.redis_errors += 1
                log.warning("delayq worker: fetch from %s failed (%s); retrying", queue.name, exc)
                await _sleep_unless(self._stopping, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self._counters.last_fetch = time.monotonic()
            self._metrics.heartbeat(queue.name)
            self._metrics.delivered(queue.name, tasks)
            for task in tasks:
                self._held[(index, task.id)] = task
                buffer.put_nowait(task)

    async def _wait_for_space(self) -> None:
        self._space.clear()
        await _sleep_unless(self._space, 0.5)

    async def _run_loop(self, index: int, buffer: asyncio.Queue[AsyncTask]) -> None:
        queue = self._queues[index]
        while not self._stopping.is_set():
            task = await buffer.get()
            key = (index, task.id)
            current = asyncio.current_task()
            assert current is not None
            self._running[key] = current
            self._metrics.handler_started(queue.name)
            try:
                await self._process(index, queue, task)
            finally:
                self._metrics.handler_ended(queue.name)
                self._running.pop(key, None)
                self._space.set()

    async def _process(self, index: int, queue: AsyncDelayQueue, task: AsyncTask) -> None:
        hooks, started = self._hooks, time.monotonic()
        call_hook(log, hooks.on_start, task)
        error: BaseException | None = None
        try:
            if self._options.timeout is None:
                result = await self._handler(task)
            else:
                async with asyncio.timeout(self._options.timeout):
                    result = await self._handler(task)
        except asyncio.CancelledError:
            if self._stopping.is_set():
                raise  # shutdown past the grace period: the task is handed back
            error = TimeoutError("handler cancelled")
        except TimeoutError as exc:
            self._counters.timed_out += 1
            error = TimeoutError(f"handler timed out after {self._options.timeout}s")
            error.__cause__ = exc
        except Exception as exc:  # the worker never dies from a task
            error = exc
        duration = time.monotonic() - started
        outcome = outcome_of(error, task.attempts, queue._policy.max_attempts)
        log_outcome(log, queue.name, task, outcome, duration)
        self._counters.processed += 1
        self._counters.progressed()
        if outcome.verdict is Verdict.ACK:
            self._counters.succeeded += 1
            self._acking.add((index, task.id))
            self._done[index].append(task)
            self._ack_ready.set()
            self._metrics.task_done(queue.name, task, "acked", duration)
            call_hook(log, hooks.on_success, task, result, duration)
            return
        self._counters.failed += 1
        self._held.pop((index, task.id), None)
        try:
            if outcome.verdict is Verdict.REJECT:
                await queue.reject(task, outcome.error)
            else:
                await queue.retry(task, outcome.delay, error=outcome.error)
            label = "dead" if outcome.dead else "retried"
        except LeaseLost:
            label = "failed"  # not recorded: the task comes back when its lease expires
            log.warning("delayq worker: lease on %s lost before its failure was recorded", task.id)
        except DelayqError as exc:
            label = "failed"
            log.warning("delayq worker: could not record failure of %s: %s", task.id, exc)
        self._metrics.task_done(queue.name, task, label, duration)
        call_hook(log, hooks.on_failure, task, error)
        if outcome.dead:
            self._counters.dead += 1
            call_hook(log, hooks.on_dead, task, error)

    async def _ack_loop(self) -> None:
        while True:
            await self._ack_ready.wait()
            self._ack_ready.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        for index, queue in enumerate(self._queues):
            batch, self._done[index] = self._done[index], []
            if not batch:
                continue
            try:
                acked = await queue.ack_many(batch)
            except DelayqError as exc:  # leases stay held: the heartbeat keeps them alive
                self._counters.redis_errors += 1
                log.warning("delayq worker: ack of %d tasks failed (%s); retrying", len(batch), exc)
                self._done[index] = batch + self._done[index]
                await asyncio.sleep(0.5)
                self._ack_ready.set()
                continue
            for task, ok in zip(batch, acked, strict=True):
                self._held.pop((index, task.id), None)
                self._acking.discard((index, task.id))
                if not ok:
                    log.warning("delayq worker: lease on %s lost before its ack", task.id)

    async def _heartbeat_loop(self) -> None:
        """Keep every held lease (buffered or running) alive while this worker has it."""
        while True:
            await asyncio.sleep(self._options.heartbeat_s(self._queues))
            for (index, task_id), task in list(self._held.items()):
                if (index, task_id) in self._acking:
                    continue  # done; its ack is on its way
                queue = self._queues[index]
                try:
                    await queue.extend(task, queue._policy.lease_ms / 1000)
                except LeaseLost:
                    self._held.pop((index, task_id), None)
                    log.warning("delayq worker: lease on %s expired while held", task_id)
                except DelayqError as exc:
                    log.warning("delayq worker: heartbeat failed (%s)", exc)

    async def _health_loop(self) -> None:
        while True:
            self._write_health()
            await asyncio.sleep(1.0)

    # -- shutdown ---------------------------------------------------------------------------

    async def _shutdown(
        self,
        fetchers: list[asyncio.Task[None]],
        runners: list[asyncio.Task[None]],
        buffers: list[asyncio.Queue[AsyncTask]],
    ) -> None:
        # Fetchers end on their own within one poll timeout: cancelling one inside poll_many
        # would drop tasks Redis already leased to it.
        await asyncio.gather(*fetchers, return_exceptions=True)
        # Fetched but not started: hand back at once, without counting an attempt.
        for index, buffer in enumerate(buffers):
            while not buffer.empty():
                await self._release(index, buffer.get_nowait())
        busy = [t for t in runners if self._is_busy(t)]
        idle = [t for t in runners if t not in busy]
        for task in idle:
            task.cancel()
        if busy:
            log.info(
                "delayq worker: waiting up to %ss for %d handlers", self._options.grace, len(busy)
            )
            _, pending = await asyncio.wait(busy, timeout=self._options.grace)
            for task in pending:
                task.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        await self._flush_acks()
        # Still held: handlers cut off by the grace period. Hand them back now.
        for (index, _), held in list(self._held.items()):
            if held not in self._done[index]:
                await self._release(index, held)

    def _is_busy(self, runner: asyncio.Task[None]) -> bool:
        return runner in self._running.values()

    async def _release(self, index: int, task: AsyncTask) -> None:
        self._held.pop((index, task.id), None)
        with contextlib.suppress(DelayqError):
            await self._queues[index].release(task)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
            installed.append(sig)
        return installed

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "delayq worker: second signal, exiting now; in-flight tasks come back later"
            )
            os._exit(128 + sig)
        log.info("delayq worker: %s received, shutting down", signal.Signals(sig).name)
        self.stop()


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
