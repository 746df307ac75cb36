"""AsyncWorker: runs ``async def`` handlers on delayed queues, and never dies from a task."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._async.queue import AsyncDelayQueue, AsyncTask
from .._core import tracing
from .._core.models import Backoff
from .._core.text import printable
from .._core.timing import Duration
from ..exceptions import DelayqError, LeaseLost
from ..metrics._base import WorkerRecorder
from .background import AsyncBackgroundWorker
from .common import (
    Hooks,
    WorkerBase,
    WorkerOptions,
    call_hook,
    internal_error_text,
)
from .ledger import Delivery

log = logging.getLogger("delayq.worker")

# How long the shutdown waits for the helper loops (acks, heartbeat, health) to end by
# themselves before it cancels them: longer than an ack takes, short enough not to hang.
HELPERS_END_S = 10.0

Handler = Callable[[AsyncTask], Awaitable[Any]]


class _TimedOut(Exception):
    """The worker's ``timeout`` cut a handler off (not a TimeoutError of the handler's own)."""


@dataclass(eq=False)
class _Run(Delivery):
    runner: asyncio.Task[Any] | None = None  # the runner task handling it


class AsyncWorker(WorkerBase):
    """Runs ``handler`` for every due task of ``queues`` with up to ``concurrency`` at once,
    split across the queues (at least one handler each: on more queues than ``concurrency``,
    one per queue).

    Return from the handler = ack. Raise = retry after the queue's backoff (dead-lettered after
    ``max_attempts``); raise :class:`~delayq.Retry` or :class:`~delayq.Reject` to choose. Leases
    are extended while a handler runs; a handler running past ``timeout`` is cancelled and its
    task retried. ``run()`` returns after :meth:`stop`: fetching stops, running handlers get
    ``grace`` seconds, and every task not finished is handed back at once. With
    ``handle_signals=True`` (as ``delayq worker`` runs it) SIGTERM/SIGINT stop it too; a worker
    embedded in an application leaves the signals to it (see :meth:`start_background`).
    Each of its loops (fetch, run, ack, heartbeat, health) is restarted if it dies; one that
    keeps dying stops the worker, and ``run()`` then raises :class:`~delayq.WorkerFailed`.

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
        timeout: Duration | None = None,
        grace: Duration = 30.0,
        prefetch: int | None = None,
        health_file: str | None = None,
        handle_signals: bool = False,
        hooks: Hooks | None = None,
        visibility_timeout: Duration | None = None,
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
        self._waiting = [asyncio.Event() for _ in self._queues]  # tasks came to run
        self._space = [asyncio.Event() for _ in self._queues]  # a fetch can refill
        self._stopping = asyncio.Event()
        # Ends the helper loops after the shutdown. Cancelling them alone is not enough: a
        # cancel that lands inside a Redis call can be lost there (seen in ack_many).
        self._helpers_end = asyncio.Event()

    _wants_coroutine = True

    # -- public -----------------------------------------------------------------------------

    def start_background(self) -> AsyncBackgroundWorker:
        """Run the worker as a task of the running event loop, e.g. in a FastAPI/Starlette
        lifespan, and return its handle: ``await handle.stop()`` (or leaving ``async with``)
        shuts it down gracefully."""
        return AsyncBackgroundWorker(self)

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler or another task)."""
        self._stopping.set()

    async def run(self) -> None:
        """Work until stopped; then shut down gracefully and return. Raises
        :class:`~delayq.WorkerFailed` (after the shutdown) if a loop could not be kept going,
        and :class:`~delayq.RedisUnavailable` at once if Redis never answered at the start
        (within the queues' reconnect timeout); once connected, it rides out any outage."""
        for queue in self._queues:
            await queue.ping()
        loop = asyncio.get_running_loop()
        installed = self._install_signals(loop)
        self._state = "running"
        self._metrics.worker_started([q.name for q in self._queues])
        helpers = [
            self._start("ack", self._ack_loop),
            self._start("health", self._health_loop),
            *(  # one per queue: a queue whose Redis is away holds up no other's leases
                self._start("heartbeat", functools.partial(self._heartbeat_loop, i), i)
                for i in range(len(self._queues))
            ),
        ]
        fetchers = [
            self._start("fetch", functools.partial(self._fetch_loop, i), i)
            for i in range(len(self._queues))
        ]
        runners = [
            self._start("run", functools.partial(self._run_loop, i), i)
            for i in range(len(self._queues))
            for _ in range(self._options.handlers[i])
        ]
        log.info(
            "delayq worker started: queues=%s concurrency=%d",
            ",".join(q.name for q in self._queues), self._options.concurrency,
        )  # fmt: skip
        try:
            await self._stopping.wait()
        finally:
            self._state = "stopping"
            self._ledger.closing = True  # acks go out at once from now on
            try:
                await self._shutdown(fetchers, runners)
            except Exception as exc:  # the rest of the shutdown must happen all the same
                self._internal_error("shutdown", "", None, exc)
            self._helpers_end.set()
            self._ack_ready.set()
            # They end on the flag: a cancel landing in an ack on its way would lose the ack
            # (the task comes back after its lease and runs again). Cancelled only if stuck.
            _, stuck = await asyncio.wait(helpers, timeout=HELPERS_END_S)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._last_acks()
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._state = "stopped"
            with contextlib.suppress(Exception):  # a broken recorder must not stop a stop
                self._metrics.worker_stopped([q.name for q in self._queues])
            self._write_health()
            self._forget_troubles()
            log.info("delayq worker stopped: processed=%d", self._counters.processed)
        self._supervisor.raise_if_failed()

    # -- loops ------------------------------------------------------------------------------

    def _start(
        self, name: str, loop: Callable[[], Awaitable[None]], index: int | None = None
    ) -> asyncio.Task[None]:
        queue = "" if index is None else self._queues[index].name
        suffix = "" if index is None else f"-{index}"
        return asyncio.create_task(
            self._supervised(name, queue, loop), name=f"delayq-worker-{name}{suffix}"
        )

    async def _supervised(self, name: str, queue: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run one of the worker's loops; start it again if it dies, or stop the worker."""
        while True:
            try:
                await loop()
                return
            except Exception as exc:  # a dead task would go unnoticed: never let one die
                delay = self._loop_died(name, queue, exc)
            if delay is None:
                self.stop()
                return
            if queue:  # fetching and running end with the shutdown; the helpers are cancelled
                await _sleep_unless(self._stopping, delay)
                if self._stopping.is_set():
                    return
            else:
                await asyncio.sleep(delay)

    async def _fetch_loop(self, index: int) -> None:
        queue, ledger = self._queues[index], self._ledger
        backoff = 0.05
        while not self._stopping.is_set():
            wanted = ledger.room(index)
            if wanted == 0:
                self._counters.last_fetch = time.monotonic()  # full, not stuck
                self._metrics.heartbeat(queue.name)
                self._space[index].clear()
                await _sleep_unless(self._space[index], 0.5)
                continue
            try:
                tasks = await queue.poll_many(
                    wanted, timeout=ledger.fetch_wait(wanted, self._poll_timeout[index])
                )
                backoff = 0.05
                self._fetch_trouble[index].succeeded()
            except DelayqError as exc:  # Redis away or refusing: keep trying, never die
                self._counters.redis_errors += 1
                self._fetch_trouble[index].failed(exc)  # logged once per outage
                await _sleep_unless(self._stopping, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if tasks:  # held at once: the heartbeat keeps these leases
                ledger.fetched(index, tasks, self._start_by(index, time.monotonic()))
                self._traced = tracing.ENABLED and tracing.configured()
                self._waiting[index].set()
            self._counters.last_fetch = time.monotonic()
            self._metrics.heartbeat(queue.name)
            self._metrics.delivered(queue.name, tasks)

    async def _run_loop(self, index: int) -> None:
        queue, ledger, waiting = self._queues[index], self._ledger, self._waiting[index]
        make = functools.partial(_Run, runner=asyncio.current_task())
        while not self._stopping.is_set():
            run = ledger.take(index, make)
            if ledger.dropped:  # their room is free: the fetch need not wait for a handler
                self._report_lapsed(queue.name, ledger.lapsed())
                self._space[index].set()
            if run is None:
                waiting.clear()
                await waiting.wait()
                continue
            try:
                self._metrics.handler_started(queue.name)
                await self._process(queue, run)
            except Exception as exc:  # the worker's own code failed on this task
                await self._recover(queue, run, "run", exc)
            finally:
                self._metrics.handler_ended(queue.name)
                if ledger.ended(run):
                    self._space[index].set()

    async def _call_handler(self, task: AsyncTask) -> Any:
        if self._options.timeout is None:
            return await self._handler(task)
        limit = asyncio.timeout(self._options.timeout)
        try:
            async with limit:
                return await self._handler(task)
        except TimeoutError as exc:
            if limit.expired():  # the worker's timeout cut the handler off
                raise _TimedOut from exc
            raise  # the handler's own (a client of its timed out): its error

    async def _process(self, queue: AsyncDelayQueue, run: Delivery) -> None:
        task, hooks, name = run.task, self._hooks, queue.name
        if hooks.on_start is not None:
            call_hook(log, hooks.on_start, task)
        error: BaseException | None = None
        result: Any = None
        try:
            if self._traced:
                with tracing.consumer_span(name, task):
                    result = await self._call_handler(task)
            elif self._options.timeout is None:  # no SDK: not even a no-op span per task
                result = await self._handler(task)
            else:
                result = await self._call_handler(task)
        except asyncio.CancelledError:
            if self._stopping.is_set():
                raise  # shutdown past the grace period: the task is handed back
            error = TimeoutError("handler cancelled")
        except _TimedOut as exc:
            self._counters.timed_out += 1
            error = TimeoutError(f"handler timed out after {self._options.timeout}s")
            error.__cause__ = exc.__cause__
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            # The worker never dies from a task (not even sys.exit): escaping a task, those
            # two would end the event loop, the worker and every handler running beside.
            error = exc
        now = time.monotonic()
        outcome = self._judged(name, run, error, result, now)
        if outcome is None:
            return
        record, args = self._failure_call(queue, task, outcome)
        recorded: BaseException | None = None
        try:  # an error other than these is the worker's own: _recover retries the task
            await record(*args)
        except DelayqError as exc:  # LeaseLost too
            recorded = exc
        self._failure_done(name, run, outcome, error, recorded, now)

    async def _recover(
        self, queue: AsyncDelayQueue, run: Delivery, where: str, exc: BaseException
    ) -> None:
        """The worker's own code failed on ``run``: log and count it, and unless its verdict
        already went to Redis, retry the task (dead-lettered after max_attempts like any)."""
        if not self._taken_back(queue.name, run, where, exc):
            return
        try:
            await queue.retry(run.task, error=internal_error_text(exc))
        except Exception as again:  # its lease runs out, and the fetch retries or buries it
            self._not_retried(run.task, again)

    async def _ack_loop(self) -> None:
        while not self._helpers_end.is_set():  # a restarted loop first acks what is left
            wait_s = self._ledger.next_ack_in(time.monotonic())
            if wait_s is None:
                await self._ack_ready.wait()
            elif wait_s > 0:
                await _sleep_unless(self._ack_ready, wait_s)
            self._ack_ready.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        for index, queue in enumerate(self._queues):
            batch = self._ledger.acks_due(index, time.monotonic())
            if not batch:
                continue
            try:
                acked: list[bool | None] = list(await queue.ack_many(batch))
                self._ack_trouble[index].succeeded()
            except asyncio.CancelledError:  # the batch stays due: the last flush sends it
                self._ledger.ack_failed(index, batch)
                raise
            except DelayqError as exc:  # leases stay held: the heartbeat keeps them alive
                self._counters.redis_errors += 1
                self._ack_trouble[index].failed(exc)  # logged once per outage
                log.debug("delayq worker: ack of %d tasks failed; retrying", len(batch))
                self._ledger.ack_failed(index, batch)
                await asyncio.sleep(0.5)
                continue
            except Exception:  # not Redis: one task's ack is broken; ack the others alone
                acked = [await self._ack_alone(queue, task) for task in batch]
            for task in self._ledger.acked(index, batch, acked):
                log.warning("delayq worker: lease on %s lost before its ack", printable(task.id))

    async def _last_acks(self) -> None:
        """Flush the acks during the shutdown, which goes on whatever fails here."""
        try:
            await self._flush_acks()
        except Exception as exc:  # the tasks not acked come back after their lease
            self._internal_error("shutdown acks", "", None, exc)

    async def _ack_alone(self, queue: AsyncDelayQueue, task: AsyncTask) -> bool | None:
        """Ack one task; None if even that fails (its lease expires and it comes back)."""
        try:
            return (await queue.ack_many([task]))[0]
        except Exception as exc:
            self._internal_error("ack", queue.name, task.id, exc)
            return None

    async def _heartbeat_loop(self, index: int) -> None:
        """Keep every lease held on queue ``index`` alive while this worker has it."""
        beat = self._options.heartbeat_s(self._queues)
        queue, lease_s = self._queues[index], self._policies[index].visibility_timeout
        while not self._helpers_end.is_set():
            await _sleep_unless(self._helpers_end, beat)
            if self._helpers_end.is_set() or lease_s is None:  # at-most-once: no lease
                continue
            for task in self._ledger.to_extend(index):
                try:
                    begun = time.monotonic()
                    await queue.extend(task, lease_s)
                    self._heartbeat_trouble[index].succeeded()
                    start_by = self._start_by(index, begun)
                    if start_by is not None:
                        self._ledger.extended(index, task, start_by)
                except LeaseLost:  # its ack may have landed since the list was taken
                    if self._ledger.lease_lost(index, task):
                        log.warning(
                            "delayq worker: lease on %s expired while held", printable(task.id)
                        )
                except DelayqError as exc:
                    self._heartbeat_trouble[index].failed(exc)  # logged once per outage
                except Exception as exc:  # not Redis: let this lease run out, keep the others
                    self._ledger.given_back(index, task)
                    self._internal_error("heartbeat", queue.name, task.id, exc)

    async def _health_loop(self) -> None:
        while not self._helpers_end.is_set():
            self._write_health()
            await _sleep_unless(self._helpers_end, 1.0)

    # -- shutdown ---------------------------------------------------------------------------

    async def _shutdown(
        self, fetchers: list[asyncio.Task[None]], runners: list[asyncio.Task[None]]
    ) -> None:
        # Fetchers end on their own within one poll timeout: cancelling one inside poll_many
        # would drop tasks Redis already leased to it.
        await asyncio.gather(*fetchers, return_exceptions=True)
        # Fetched but not started: hand back at once, without counting an attempt.
        for index in range(len(self._queues)):
            for task in self._ledger.unstarted(index):
                await self._release(index, task)
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
        await self._last_acks()
        # Still held and not acked: handlers cut off by the grace period. Hand them back now.
        for index, held in self._ledger.unsettled():
            await self._release(index, held)

    def _is_busy(self, runner: asyncio.Task[None]) -> bool:
        return any(run.runner is runner for run in self._ledger.running())

    async def _release(self, index: int, task: AsyncTask) -> None:
        self._ledger.given_back(index, task)
        # Whatever fails here, the shutdown goes on: the task comes back after its lease.
        with contextlib.suppress(Exception):
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
    # Not wait_for: on 3.11 it can swallow a cancel that lands as the event is set, and a
    # helper loop that outlives its cancel hangs the shutdown.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
