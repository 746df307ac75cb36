"""Worker: runs plain (sync) handlers in threads on delayed queues; never dies from a task."""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_lib
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.handling import Verdict, outcome_of
from .._core.models import Backoff
from .._core.text import printable
from .._sync.queue import DelayQueue, Task
from ..exceptions import DelayqError, LeaseLost
from ..metrics._base import WorkerRecorder
from .background import BackgroundWorker
from .common import (
    Delivery,
    Hooks,
    WorkerBase,
    WorkerOptions,
    call_hook,
    internal_error_text,
    log_outcome,
)

log = logging.getLogger("delayq.worker")

Handler = Callable[[Task], Any]


@dataclass(eq=False)
class _Run(Delivery):
    thread: threading.Thread = field(default_factory=threading.current_thread)
    abandoned: bool = False  # timed out or cut off by shutdown: its result no longer counts
    finished: bool = False  # the handler returned first: it can no longer be abandoned


class Worker(WorkerBase):
    """Runs ``handler`` for every due task of ``queues`` in ``concurrency`` threads.

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
        timeout: float | None = None,
        grace: float = 30.0,
        prefetch: int | None = None,
        health_file: str | None = None,
        handle_signals: bool = False,
        hooks: Hooks | None = None,
        visibility_timeout: float | None = None,
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
        self._lock = threading.Lock()
        self._ack_ready = threading.Event()
        self._space = threading.Event()
        self._stopping = threading.Event()
        self._finished = threading.Event()  # ends the helper threads, after the shutdown
        self._buffers = [queue_lib.Queue[Task]() for _ in self._queues]

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
            for _ in range(self._options.slots)
        ]
        helpers = [
            self._thread(self._ack_loop, name="ack"),
            self._thread(self._upkeep_loop, name="upkeep"),
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
        queue, buffer = self._queues[index], self._buffers[index]
        backoff = 0.05
        while not self._stopping.is_set():
            with self._lock:
                busy = sum(1 for key in self._running if key[0] == index)
            space = self._options.room(buffer.qsize() + busy)
            if space <= 0:
                self._counters.last_fetch = time.monotonic()  # full, not stuck
                self._metrics.heartbeat(queue.name)
                self._space.clear()
                self._space.wait(0.5)
                continue
            try:
                tasks = queue.poll_many(
                    space, timeout=min(self._policies[index].safety_interval, 0.5)
                )
                backoff = 0.05
            except DelayqError as exc:  # Redis away or refusing: keep trying, never die
                self._counters.redis_errors += 1
                log.warning(
                    "delayq worker: fetch from %s failed (%s); retrying", queue.name, printable(exc)
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            with self._lock:  # held first: the heartbeat keeps these leases whatever follows
                for task in tasks:
                    self._held[(index, task.id)] = task
            for task in tasks:
                buffer.put(task)
            self._counters.last_fetch = time.monotonic()
            self._metrics.heartbeat(queue.name)
            self._metrics.delivered(queue.name, tasks)

    def _run_loop(self, index: int) -> None:
        queue, buffer = self._queues[index], self._buffers[index]
        while not self._stopping.is_set():
            try:
                task = buffer.get(timeout=0.2)
            except queue_lib.Empty:
                continue
            run = _Run(index, task)
            with self._lock:
                self._running[(index, task.id)] = run
            try:
                self._metrics.handler_started(queue.name)
                self._process(queue, run)
            except BaseException as exc:  # the worker's own code failed on this task
                self._recover(queue, run, "run", exc)
            finally:
                self._metrics.handler_ended(queue.name)
                with self._lock:
                    if self._running.get((index, task.id)) is run:
                        del self._running[(index, task.id)]
                self._space.set()
            if run.abandoned:
                return  # a replacement thread holds this slot now

    def _process(self, queue: DelayQueue, run: _Run) -> None:
        task, hooks = run.task, self._hooks
        call_hook(log, hooks.on_start, task)
        error: BaseException | None = None
        result: Any = None
        try:
            result = self._handler(task)
        except BaseException as exc:  # the worker never dies from a task (not even sys.exit)
            error = exc
        with self._lock:  # exactly one of "finished" and "abandoned" wins
            run.finished = not run.abandoned
        if not run.finished:
            log.warning(
                "delayq worker: abandoned handler for %s returned; result ignored",
                printable(task.id),
            )
            return
        duration = time.monotonic() - run.started
        self._settle(queue, run, error, result, duration)

    def _settle(
        self,
        queue: DelayQueue,
        run: _Run,
        error: BaseException | None,
        result: Any,
        duration: float,
    ) -> None:
        task, index, hooks = run.task, run.index, self._hooks
        outcome = outcome_of(error, task.attempts, self._policies[index].max_attempts)
        log_outcome(log, queue.name, task, outcome, duration)
        self._counters.processed += 1
        self._counters.progressed()
        if outcome.verdict is Verdict.ACK:
            self._counters.succeeded += 1
            with self._lock:
                self._acking.add((index, task.id))
                self._done[index].append(task)
                run.settled = True
            self._ack_ready.set()
            self._metrics.task_done(queue.name, task, "acked", duration)
            call_hook(log, hooks.on_success, task, result, duration)
            return
        self._counters.failed += 1
        with self._lock:
            self._held.pop((index, task.id), None)
        try:  # an error other than these is the worker's own: _recover retries the task
            if outcome.verdict is Verdict.REJECT:
                queue.reject(task, outcome.error)
            else:
                queue.retry(task, outcome.delay, error=outcome.error)
            label = "dead" if outcome.dead else "retried"
        except LeaseLost:
            label = "failed"  # not recorded: the task comes back when its lease expires
            log.warning(
                "delayq worker: lease on %s lost before its failure was recorded",
                printable(task.id),
            )
        except DelayqError as exc:
            label = "failed"
            log.warning(
                "delayq worker: could not record failure of %s: %s",
                printable(task.id), printable(exc),
            )  # fmt: skip
        run.settled = True
        self._metrics.task_done(queue.name, task, label, duration)
        call_hook(log, hooks.on_failure, task, error)
        if outcome.dead:
            self._counters.dead += 1
            call_hook(log, hooks.on_dead, task, error)

    def _recover(self, queue: DelayQueue, run: _Run, where: str, exc: BaseException) -> None:
        """The worker's own code failed on ``run``: log and count it, and unless its verdict
        already went to Redis, retry the task (dead-lettered after max_attempts like any)."""
        self._internal_error(where, queue.name, run.task.id, exc)
        with self._lock:
            if run.settled:
                return
            run.settled = True
            self._held.pop((run.index, run.task.id), None)
        try:
            queue.retry(run.task, error=internal_error_text(exc))
        except LeaseLost:
            pass  # it already comes back by the lease
        except Exception as again:  # its lease runs out, and the fetch retries or buries it
            log.warning(
                "delayq worker: could not retry %s after an internal error (%s); it comes "
                "back when its lease expires", printable(run.task.id), printable(again),
            )  # fmt: skip

    def _ack_loop(self) -> None:
        while not self._finished.is_set():
            self._ack_ready.wait(0.5)
            self._ack_ready.clear()
            self._flush_acks()

    def _flush_acks(self) -> None:
        for index, queue in enumerate(self._queues):
            with self._lock:
                batch, self._done[index] = self._done[index], []
            if not batch:
                continue
            try:
                acked = queue.ack_many(batch)
            except DelayqError as exc:  # leases stay held: the heartbeat keeps them alive
                self._counters.redis_errors += 1
                log.warning(
                    "delayq worker: ack of %d tasks failed (%s); retrying",
                    len(batch), printable(exc),
                )  # fmt: skip
                with self._lock:
                    self._done[index] = batch + self._done[index]
                self._stopping.wait(0.5)
                continue
            except Exception:  # not Redis: one task's ack is broken; ack the others alone
                acked = [self._ack_alone(queue, task) for task in batch]
            with self._lock:
                for task in batch:
                    self._held.pop((index, task.id), None)
                    self._acking.discard((index, task.id))
            for task, ok in zip(batch, acked, strict=True):
                if ok is False:
                    log.warning(
                        "delayq worker: lease on %s lost before its ack", printable(task.id)
                    )

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
        """Heartbeat (extend held leases), timeouts and the health file."""
        beat = self._options.heartbeat_s(self._queues)
        next_beat = time.monotonic() + beat
        next_health = 0.0
        while not self._finished.is_set():  # heartbeats go on through the grace period
            now = time.monotonic()
            if self._options.timeout is not None:
                self._abandon_overdue(now)
            if now >= next_beat:
                self._extend_held()
                next_beat = now + beat
            if now >= next_health:
                self._write_health()
                next_health = now + 1.0
            self._finished.wait(0.05)

    def _abandon_overdue(self, now: float) -> None:
        timeout = self._options.timeout
        assert timeout is not None
        with self._lock:
            overdue = [
                r
                for r in self._running.values()
                if not r.abandoned and not r.finished and now - r.started > timeout
            ]
            for run in overdue:
                run.abandoned = True
                del self._running[(run.index, run.task.id)]
        for run in overdue:
            queue = self._queues[run.index]
            with self._lock:  # shutdown must not wait for a thread it gave up on
                if run.thread in self._runners:
                    self._runners.remove(run.thread)
            self._counters.timed_out += 1
            error = TimeoutError(f"handler timed out after {timeout}s (abandoned)")
            try:
                self._settle(queue, run, error, None, now - run.started)
            except Exception as exc:  # the worker's own code failed on this task
                self._recover(queue, run, "timeout", exc)
            self._runners.append(
                self._thread(self._run_loop, run.index, name="run", queue=queue.name)
            )

    def _extend_held(self) -> None:
        with self._lock:
            held = [(key, task) for key, task in self._held.items() if key not in self._acking]
        for (index, task_id), task in held:
            queue, lease_s = self._queues[index], self._policies[index].visibility_timeout
            if lease_s is None:
                continue  # at-most-once: no lease to keep
            try:
                queue.extend(task, lease_s)
            except LeaseLost:
                with self._lock:
                    self._held.pop((index, task_id), None)
                log.warning("delayq worker: lease on %s expired while held", printable(task_id))
            except DelayqError as exc:
                log.warning("delayq worker: heartbeat failed (%s)", printable(exc))
            except Exception as exc:  # not Redis: let this lease run out, keep the others
                with self._lock:
                    self._held.pop((index, task_id), None)
                self._internal_error("heartbeat", queue.name, task_id, exc)

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self, fetchers: list[threading.Thread]) -> None:
        for thread in fetchers:
            thread.join(5)
        # Fetched but not started: hand back at once, without counting an attempt.
        for index, buffer in enumerate(self._buffers):
            while True:
                try:
                    self._release(index, buffer.get_nowait())
                except queue_lib.Empty:
                    break
        deadline = time.monotonic() + self._options.grace
        if self._running:
            log.info(
                "delayq worker: waiting up to %ss for %d handlers",
                self._options.grace,
                len(self._running),
            )
        with self._lock:
            runners = list(self._runners)
        for thread in runners:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._last_acks()
        # Handlers cut off by the grace period: their tasks go back now, not after the lease.
        with self._lock:
            cut_off = [run for run in self._running.values() if not run.finished]
            for run in cut_off:
                run.abandoned = True
            self._running.clear()
        for run in cut_off:
            self._release(run.index, run.task)

    def _release(self, index: int, task: Task) -> None:
        with self._lock:
            self._held.pop((index, task.id), None)
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
