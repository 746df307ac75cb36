"""Worker: runs plain (sync) handlers in threads on delayed queues; never dies from a task."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core import tracing
from .._core.handling import Reject
from .._core.models import Backoff
from .._core.text import printable
from .._core.timing import Duration
from .._sync.queue import DelayQueue, Task
from ..exceptions import DelayqError, LeaseLost
from ..metrics._base import WorkerRecorder
from .background import BackgroundWorker
from .common import (
    Hooks,
    WorkerBase,
    WorkerOptions,
    call_hook,
    internal_error_text,
)
from .ledger import Delivery

log = logging.getLogger("delayq.worker")

Handler = Callable[[Task], Any]


@dataclass(eq=False)
class _Run(Delivery):
    thread: threading.Thread = field(default_factory=threading.current_thread)
    abandoned: bool = False  # timed out or cut off by shutdown: its result no longer counts
    finished: bool = False  # the handler returned first: it can no longer be abandoned


class Worker(WorkerBase):
    """Runs ``handler`` for every due task of ``queues`` in ``concurrency`` threads, split
    across the queues (at least one each: on more queues than ``concurrency``, one per queue).

    The same contract as :class:`AsyncWorker`: return = ack, raise = retry with backoff
    (dead-lettered after ``max_attempts``), :class:`~delayq.Retry` / :class:`~delayq.Reject` to
    choose; leases are extended while handlers run. A handler running past ``timeout`` cannot be
    killed (it is a thread): it is abandoned, its task retried, and a fresh thread takes its
    slot. ``run()`` blocks until :meth:`stop`, then shuts down gracefully; with
    ``handle_signals=True`` (as ``delayq worker`` runs it) SIGTERM/SIGINT stop it too. A
    worker embedded in an application leaves the signals to it: see :meth:`start_background`.
    Each of its loops (fetch, run, ack, upkeep) is restarted if it dies; one that keeps dying
    stops the worker, and ``run()`` then raises :class:`~delayq.WorkerFailed`.

    ``visibility_timeout``, ``max_attempts`` and ``retry_backoff``, when given, override the
    queues' own lease and retry policy for the tasks this worker handles. ``metrics``: a
    recorder such as :class:`delayq.metrics.WorkerMetrics` (Prometheus); none by default.
    """

    def __init__(
        self,
        queues: DelayQueue | Sequence[DelayQueue],
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
            [queues] if isinstance(queues, DelayQueue) else list(queues),
            handler,
            WorkerOptions.build(
                1 if isinstance(queues, DelayQueue) else len(queues),
                concurrency, timeout, grace, prefetch, health_file,
            ),
            handle_signals,
            hooks,
            (visibility_timeout, max_attempts, retry_backoff),
            metrics,
        )  # fmt: skip
        self._lock = threading.Lock()  # guards the ledger and the runs' flags
        self._guard = self._lock
        self._waiting = [threading.Condition(self._lock) for _ in self._queues]  # tasks came
        self._space = [threading.Event() for _ in self._queues]  # a fetch can refill
        self._ack_ready = threading.Event()
        self._stopping = threading.Event()
        self._finished = threading.Event()  # ends the helper threads, after the shutdown

    _wants_coroutine = False

    # -- public -----------------------------------------------------------------------------

    def start_background(self) -> BackgroundWorker:
        """Run the worker in a background thread, e.g. inside a web application, and return
        its handle: ``handle.stop()`` (or leaving ``with``) shuts it down gracefully."""
        return BackgroundWorker(self)

    def stop(self) -> None:
        """Begin a graceful shutdown (safe from a signal handler or another thread)."""
        self._stopping.set()

    def run(self) -> None:
        """Work until stopped; then shut down gracefully and return. Raises
        :class:`~delayq.WorkerFailed` (after the shutdown) if a loop could not be kept going,
        and :class:`~delayq.RedisUnavailable` at once if Redis never answered at the start
        (within the queues' reconnect timeout); once connected, it rides out any outage."""
        for queue in self._queues:
            queue.ping()
        previous = self._install_signals()
        self._state = "running"
        self._metrics.worker_started([q.name for q in self._queues])
        fetchers = [
            self._thread(self._fetch_loop, i, name="fetch", queue=q.name)
            for i, q in enumerate(self._queues)
        ]
        self._runners = [
            self._thread(self._run_loop, i, name="run", queue=q.name)
            for i, q in enumerate(self._queues)
            for _ in range(self._options.handlers[i])
        ]
        helpers = [
            self._thread(self._ack_loop, name="ack"),
            self._thread(self._upkeep_loop, name="upkeep"),
            *(  # one per queue: a queue whose Redis is away holds up no other's leases
                self._thread(self._heartbeat_loop, i, name="heartbeat", queue=q.name)
                for i, q in enumerate(self._queues)
            ),
        ]
        log.info(
            "delayq worker started: queues=%s concurrency=%d",
            ",".join(q.name for q in self._queues), self._options.concurrency,
        )  # fmt: skip
        try:
            while not self._stopping.wait(0.2):  # wake often: signals run in this thread
                pass
        finally:
            self._state = "stopping"
            with self._lock:
                self._ledger.closing = True  # acks go out at once from now on
            try:
                self._shutdown(fetchers)
            except Exception as exc:  # the rest of the shutdown must happen all the same
                self._internal_error("shutdown", "", None, exc)
            self._finished.set()
            self._ack_ready.set()
            for thread in helpers:
                thread.join(5)
            self._last_acks()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._state = "stopped"
            with contextlib.suppress(Exception):  # a broken recorder must not stop a stop
                self._metrics.worker_stopped([q.name for q in self._queues])
            self._write_health()
            self._forget_troubles()
            log.info("delayq worker stopped: processed=%d", self._counters.processed)
        self._supervisor.raise_if_failed()

    # -- threads ----------------------------------------------------------------------------

    def _thread(
        self, target: Callable[..., None], *args: Any, name: str, queue: str = ""
    ) -> threading.Thread:
        thread = threading.Thread(
            target=self._supervised,
            args=(target, args, name, queue),
            name=f"delayq-worker-{name}",
            daemon=True,
        )
        thread.start()
        return thread

    def _supervised(
        self, target: Callable[..., None], args: tuple[Any, ...], name: str, queue: str
    ) -> None:
        """Run one of the worker's loops; start it again if it dies, or stop the worker."""
        # The helpers work on through the shutdown; fetching and running end with it.
        until = self._finished if name in ("ack", "upkeep") else self._stopping
        while True:
            try:
                target(*args)
                return
            except BaseException as exc:  # a dead thread would go unnoticed: never let one die
                delay = self._loop_died(name, queue, exc)
            if delay is None:
                self.stop()
                return
            if until.wait(delay):
                return

    def _fetch_loop(self, index: int) -> None:
        queue, ledger, space = self._queues[index], self._ledger, self._space[index]
        backoff = 0.05
        while not self._stopping.is_set():
            with self._lock:
                wanted = ledger.room(index)
            if wanted == 0:
                self._counters.last_fetch = time.monotonic()  # full, not stuck
                self._metrics.heartbeat(queue.name)
                space.clear()
                with self._lock:  # a handler that ended before the clear set it in vain
                    wanted = ledger.room(index)
                if wanted == 0:
                    space.wait(0.5)
                    continue
            try:
                tasks = queue.poll_many(
                    wanted, timeout=ledger.fetch_wait(wanted, self._poll_timeout[index])
                )
                backoff = 0.05
                self._fetch_trouble[index].succeeded()
            except DelayqError as exc:  # Redis away or refusing: keep trying, never die
                self._counters.redis_errors += 1
                self._fetch_trouble[index].failed(exc)  # logged once per outage
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if tasks:
                start_by = self._start_by(index, time.monotonic())
                self._traced = tracing.ENABLED and tracing.configured()
                with self._lock:  # held at once: the heartbeat keeps these leases
                    ledger.fetched(index, tasks, start_by)
                    self._waiting[index].notify(len(tasks))
            self._counters.last_fetch = time.monotonic()
            self._metrics.heartbeat(queue.name)
            self._metrics.delivered(queue.name, tasks)

    def _run_loop(self, index: int) -> None:
        queue, ledger, waiting = self._queues[index], self._ledger, self._waiting[index]
        while not self._stopping.is_set():
            with self._lock:
                run = ledger.take(index, _Run)
                lapsed = ledger.lapsed() if ledger.dropped else ()
                if run is None:
                    waiting.wait(0.2)
            if lapsed:  # their room is free: the fetch need not wait for a handler to end
                self._report_lapsed(queue.name, lapsed)
                self._space[index].set()
            if run is None:
                continue
            try:
                self._metrics.handler_started(queue.name)
                self._process(queue, run)
            except BaseException as exc:  # the worker's own code failed on this task
                self._recover(queue, run, "run", exc)
            finally:
                self._metrics.handler_ended(queue.name)
                with self._lock:
                    refill = ledger.ended(run)
                if refill and not self._space[index].is_set():
                    self._space[index].set()
            if run.abandoned:
                return  # a replacement thread holds this slot now

    def _process(self, queue: DelayQueue, run: _Run) -> None:
        task, hooks = run.task, self._hooks
        if hooks.on_start is not None:
            call_hook(log, hooks.on_start, task)
        error: BaseException | None = None
        result: Any = None
        try:
            if self._traced:
                with tracing.consumer_span(queue.name, task):
                    result = self._handler(task)
            else:  # no SDK: not even a no-op span per task
                result = self._handler(task)
        except BaseException as exc:  # the worker never dies from a task (not even sys.exit)
            error = exc
        else:
            if inspect.isawaitable(result):
                error, result = _refuse_awaitable(self._handler, result), None
        with self._lock:  # exactly one of "finished" and "abandoned" wins
            run.finished = not run.abandoned
        if not run.finished:
            log.warning(
                "delayq worker: abandoned handler for %s returned; result ignored",
                printable(task.id),
            )
            return
        self._settle(queue, run, error, result, time.monotonic())

    def _settle(
        self, queue: DelayQueue, run: _Run, error: BaseException | None, result: Any, now: float
    ) -> None:
        outcome = self._judged(queue.name, run, error, result, now)
        if outcome is None:
            return
        record, args = self._failure_call(queue, run.task, outcome)
        recorded: BaseException | None = None
        try:  # an error other than these is the worker's own: _recover retries the task
            record(*args)
        except DelayqError as exc:  # LeaseLost too
            recorded = exc
        self._failure_done(queue.name, run, outcome, error, recorded, now)

    def _recover(self, queue: DelayQueue, run: _Run, where: str, exc: BaseException) -> None:
        """The worker's own code failed on ``run``: log and count it, and unless its verdict
        already went to Redis, retry the task (dead-lettered after max_attempts like any)."""
        if not self._taken_back(queue.name, run, where, exc):
            return
        try:
            queue.retry(run.task, error=internal_error_text(exc))
        except Exception as again:  # its lease runs out, and the fetch retries or buries it
            self._not_retried(run.task, again)

    def _ack_loop(self) -> None:
        while not self._finished.is_set():
            with self._lock:
                wait_s = self._ledger.next_ack_in(time.monotonic())
            if wait_s is None or wait_s > 0:
                self._ack_ready.wait(0.5 if wait_s is None else wait_s)
            self._ack_ready.clear()
            self._flush_acks()

    def _flush_acks(self) -> None:
        for index, queue in enumerate(self._queues):
            with self._lock:
                batch = self._ledger.acks_due(index, time.monotonic())
            if not batch:
                continue
            try:
                acked: list[bool | None] = list(queue.ack_many(batch))
                self._ack_trouble[index].succeeded()
            except DelayqError as exc:  # leases stay held: the heartbeat keeps them alive
                self._counters.redis_errors += 1
                self._ack_trouble[index].failed(exc)  # logged once per outage
                log.debug("delayq worker: ack of %d tasks failed; retrying", len(batch))
                with self._lock:
                    self._ledger.ack_failed(index, batch)
                self._finished.wait(0.5)
                continue
            except Exception:  # not Redis: one task's ack is broken; ack the others alone
                acked = [self._ack_alone(queue, task) for task in batch]
            with self._lock:
                lost = self._ledger.acked(index, batch, acked)
            for task in lost:
                log.warning("delayq worker: lease on %s lost before its ack", printable(task.id))

    def _last_acks(self) -> None:
        """Flush the acks during the shutdown, which goes on whatever fails here."""
        try:
            self._flush_acks()
        except Exception as exc:  # the tasks not acked come back after their lease
            self._internal_error("shutdown acks", "", None, exc)

    def _ack_alone(self, queue: DelayQueue, task: Task) -> bool | None:
        """Ack one task; None if even that fails (its lease expires and it comes back)."""
        try:
            return queue.ack_many([task])[0]
        except Exception as exc:
            self._internal_error("ack", queue.name, task.id, exc)
            return None

    def _upkeep_loop(self) -> None:
        """Timeouts and the health file."""
        next_health = 0.0
        while not self._finished.is_set():
            now = time.monotonic()
            if self._options.timeout is not None:
                self._abandon_overdue(now)
            if now >= next_health:
                self._write_health()
                next_health = now + 1.0
            self._finished.wait(0.05)

    def _heartbeat_loop(self, index: int) -> None:
        """Keep every lease held on queue ``index`` alive while this worker has it (through
        the grace period too)."""
        beat = self._options.heartbeat_s(self._queues)
        while not self._finished.wait(beat):
            if self._policies[index].visibility_timeout is not None:  # at-most-once: none
                self._extend_held(index)

    def _abandon_overdue(self, now: float) -> None:
        timeout = self._options.timeout
        assert timeout is not None
        with self._lock:
            overdue = [
                r
                for r in self._ledger.running()
                if not r.abandoned and not r.finished and now - r.started > timeout
            ]
            for run in overdue:
                run.abandoned = True
                if self._ledger.ended(run):
                    self._space[run.index].set()
        for run in overdue:
            queue = self._queues[run.index]
            with self._lock:  # shutdown must not wait for a thread it gave up on
                if run.thread in self._runners:
                    self._runners.remove(run.thread)
            self._counters.timed_out += 1
            error = TimeoutError(f"handler timed out after {timeout}s (abandoned)")
            try:
                self._settle(queue, run, error, None, now)
            except Exception as exc:  # the worker's own code failed on this task
                self._recover(queue, run, "timeout", exc)
            self._runners.append(
                self._thread(self._run_loop, run.index, name="run", queue=queue.name)
            )

    def _extend_held(self, index: int) -> None:
        queue, lease_s = self._queues[index], self._policies[index].visibility_timeout
        with self._lock:
            held = self._ledger.to_extend(index)
        for task in held:
            try:
                begun = time.monotonic()
                queue.extend(task, lease_s)
                self._heartbeat_trouble[index].succeeded()
                start_by = self._start_by(index, begun)
                if start_by is not None:
                    with self._lock:
                        self._ledger.extended(index, task, start_by)
            except LeaseLost:
                with self._lock:  # its ack may have landed since the list was taken
                    news = self._ledger.lease_lost(index, task)
                if news:
                    log.warning("delayq worker: lease on %s expired while held", printable(task.id))
            except DelayqError as exc:
                self._heartbeat_trouble[index].failed(exc)  # logged once per outage
            except Exception as exc:  # not Redis: let this lease run out, keep the others
                with self._lock:
                    self._ledger.given_back(index, task)
                self._internal_error("heartbeat", queue.name, task.id, exc)

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self, fetchers: list[threading.Thread]) -> None:
        # Fetchers end on their own within one poll timeout, or once their Redis answers or
        # their reconnect timeout runs out: a fetch that got through after the hand-back
        # below would keep its tasks leased to a stopped worker (as AsyncWorker, it waits).
        for thread in fetchers:
            thread.join()
        # Fetched but not started: hand back at once, without counting an attempt.
        for index in range(len(self._queues)):
            with self._lock:
                unstarted = self._ledger.unstarted(index)
            for task in unstarted:
                self._release(index, task)
        deadline = time.monotonic() + self._options.grace
        if busy := self._ledger.busy():
            log.info("delayq worker: waiting up to %ss for %d handlers", self._options.grace, busy)
        with self._lock:
            runners = list(self._runners)
        for thread in runners:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._last_acks()
        # Handlers cut off by the grace period: their tasks go back now, not after the lease.
        with self._lock:
            cut_off = [run for run in self._ledger.running() if not run.finished]
            for run in self._ledger.running():
                run.abandoned = run.abandoned or not run.finished
                self._ledger.ended(run)
        for run in cut_off:
            self._release(run.index, run.task)
        with self._lock:  # anything else still held and not acked goes back too
            left = self._ledger.unsettled()
        for index, task in left:
            self._release(index, task)

    def _release(self, index: int, task: Task) -> None:
        with self._lock:
            self._ledger.given_back(index, task)
        try:
            self._queues[index].release(task)
        except Exception as exc:  # whatever it is, the shutdown goes on
            log.warning(
                "delayq worker: could not hand back %s (%s); it returns after its lease",
                printable(task.id),
                printable(exc),
            )

    def _install_signals(self) -> dict[int, Any]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, sig: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "delayq worker: second signal, exiting now; in-flight tasks come back later"
            )
            os._exit(128 + sig)
        log.info("delayq worker: %s received, shutting down", signal.Signals(sig).name)
        self.stop()


def _refuse_awaitable(handler: Any, result: Any) -> Reject:
    """A plain function that returned an awaitable (e.g. a sync wrapper of an async def, which
    construction cannot tell apart): nothing awaits it in a thread, so the work did not happen.
    Acking would lose it and retrying would repeat this: dead-letter it at once, and say why."""
    close = getattr(result, "close", None)
    if callable(close):  # a coroutine: closed, it does not warn "never awaited" later
        with contextlib.suppress(Exception):
            close()
    name = printable(getattr(handler, "__qualname__", type(handler).__qualname__))
    return Reject(
        f"the handler {name} returned {type(result).__qualname__}, an awaitable that Worker "
        "(threads) cannot run, so the task was not handled: run this handler with AsyncWorker, "
        "or make it return its result"
    )
