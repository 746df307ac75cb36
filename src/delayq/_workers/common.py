"""Options, hooks, logging and health files shared by both workers."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.handling import Counters, Outcome, Verdict, WorkerHealth, describe, outcome_of
from .._core.options import check_int
from .._core.outages import OUTAGES, where_of
from .._core.text import printable, utf8_safe
from .._core.timing import Duration, format_duration, setting_s
from ..exceptions import ConfigError, LeaseLost, WorkerFailed
from ..metrics._base import NOOP, WorkerRecorder
from .ledger import Ledger, Pace

log = logging.getLogger("delayq.worker")


class RedisTrouble:
    """One loop of a worker (a queue's fetches, its acks, the heartbeat) reporting its Redis
    failures to the process's outage log (_core/outages.py): a Redis away for 8 s is one
    warning and one recovery line, not a line per retry of every loop."""

    def __init__(self, what: str, fallback: str) -> None:
        self.what = what  # "fetch from orders"
        self.fallback = fallback  # the name of a failure that names no Redis: the queue's
        self._where: str | None = None

    def failed(self, exc: BaseException) -> None:
        self._where = where_of(exc, self.fallback)
        OUTAGES.lost(self._where, self, exc, self.what)

    def succeeded(self) -> None:
        """A call got through (cheap unless a failure came before it)."""
        if self._where is not None:
            where, self._where = self._where, None
            OUTAGES.back(where, self)

    def close(self) -> None:
        OUTAGES.forget(self)


@dataclass(frozen=True, slots=True)
class Hooks:
    """Callbacks for logging, tracing and metrics; exceptions in them are logged and ignored.

    ``on_start(task)``, ``on_success(task, result, duration_s)``, ``on_failure(task, exc)``,
    ``on_dead(task, exc)`` (the failure dead-lettered the task).
    """

    on_start: Callable[[Any], Any] | None = None
    on_success: Callable[[Any, Any, float], Any] | None = None
    on_failure: Callable[[Any, BaseException | None], Any] | None = None
    on_dead: Callable[[Any, BaseException | None], Any] | None = None


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    concurrency: int
    # Handlers per queue: concurrency split across the queues, the first ones taking what
    # does not divide, at least one each (a worker on more queues than concurrency runs one
    # handler per queue).
    handlers: tuple[int, ...]
    prefetch: int  # tasks fetched ahead per queue, handed back on shutdown
    timeout: float | None  # seconds
    grace: float  # seconds
    health_file: str | None

    @classmethod
    def build(
        cls,
        queues: int,
        concurrency: int,
        timeout: Duration | None,
        grace: Duration,
        prefetch: int | None,
        health_file: str | None,
    ) -> WorkerOptions:
        if queues < 1:
            raise ConfigError("a worker needs at least one queue")
        check_int(concurrency, "concurrency", 1, 10_000)
        timeout_s = None if timeout is None else setting_s(timeout, "timeout", allow_zero=False)
        grace_s = setting_s(grace, "grace")
        handlers = tuple(
            max(1, concurrency // queues + (i < concurrency % queues)) for i in range(queues)
        )
        slots = handlers[0]  # the most any queue has
        if prefetch is None:
            # Under a backlog the round trips per task, not Redis, set the pace: fetching a
            # few batches ahead cuts them. Prefetched leases are kept alive by the heartbeat
            # and handed back at shutdown.
            prefetch = 4 * slots
        check_int(prefetch, "prefetch", 0)
        return cls(concurrency, handlers, prefetch, timeout_s, grace_s, health_file)

    @staticmethod
    def heartbeat_s(queues: Sequence[Any]) -> float:
        """Extend leases three times per visibility timeout of the shortest one."""
        leases = [q.policy.visibility_timeout or 30.0 for q in queues]
        return max(0.05, min(leases) / 3)


def log_outcome(
    log: logging.Logger, queue: str, task: Any, outcome: Outcome, duration: float
) -> None:
    if outcome.verdict is Verdict.ACK and not log.isEnabledFor(logging.DEBUG):
        return  # the hot path: no string building for a log line nobody reads
    fields = (
        f"queue={queue} task={printable(task.id)} attempt={task.attempts} "
        f"lateness_ms={task.lateness_ms} duration_ms={duration * 1000:.1f}"
    )
    if outcome.verdict is Verdict.ACK:
        log.debug("delayq task done %s", fields)
    elif outcome.verdict is Verdict.THROTTLE:  # [L]
        log.info("delayq task rate limited %s retry_after_s=%s", fields, outcome.delay)
    elif outcome.dead:
        log.error("delayq task dead-lettered %s error=%s", fields, _first_line(outcome.error))
    else:
        log.warning(
            "delayq task failed, will retry %s error=%s", fields, _first_line(outcome.error)
        )


def _first_line(text: str) -> str:
    """The last non-blank line of an error (the exception itself), safe for a log line: an
    error text carries task data, and task data may carry terminal escapes."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return printable(lines[-1]) if lines else ""


def write_health_file(path: str, health: WorkerHealth) -> None:
    """Atomically replace ``path`` with the worker's health as JSON (a supervisor reads it)."""
    doc = {**health.as_dict(), "pid": os.getpid(), "updated_at": time.time()}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".delayq-health-")
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out)
    os.replace(tmp, path)


def call_hook(log: logging.Logger, hook: Callable[..., Any] | None, *args: Any) -> None:
    """Run a user hook; a broken hook must not break the worker."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception as exc:  # whatever the hook raised, the worker goes on
        log.error(  # its text may carry task data: escaped, like every line of ours
            "delayq worker: hook %s failed: %s\n%s",
            printable(getattr(hook, "__qualname__", type(hook).__qualname__)),
            printable(_summary(exc)), printable(describe(exc), keep_newlines=True),
        )  # fmt: skip


def health_of(
    state: str,
    counters: Counters,
    running: int,
    queues: Sequence[Any],
    failure: str | None = None,
) -> WorkerHealth:
    now = time.monotonic()
    stale_after = 3 * max(q.policy.safety_interval for q in queues) + 5
    since_fetch = now - counters.last_fetch
    reason = None
    if failure is not None:
        reason = failure
    elif state != "running":
        reason = f"the worker is {state}"
    elif since_fetch >= stale_after:
        reason = f"no fetch for {format_duration(since_fetch)}"
    return WorkerHealth(
        state=state,
        alive=reason is None,
        running=running,
        processed=counters.processed,
        succeeded=counters.succeeded,
        failed=counters.failed,
        dead=counters.dead,
        timed_out=counters.timed_out,
        redis_errors=counters.redis_errors,
        seconds_since_progress=round(now - counters.last_progress, 3),
        seconds_since_fetch=round(since_fetch, 3),
        internal_errors=counters.internal_errors,
        loop_restarts=counters.loop_restarts,
        reason=reason,
        unknown_queues=tuple(q.name for q in queues if q.known is False),
    )


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a worker loop that died is started again, and when the worker gives up on it."""

    max_deaths: int = 5  # deaths of one loop within window_s that fail the worker
    window_s: float = 60.0
    first_backoff_s: float = 0.05  # doubled for each death still in the window
    max_backoff_s: float = 5.0


@dataclass
class LoopSupervisor:
    """The bookkeeping of supervised worker loops (fetch, run, ack, heartbeat): the thread and
    asyncio workers each restart a loop that raised, after the delay :meth:`died` returns, and
    stop with :attr:`failure` as the reason once it returns None."""

    counters: Counters
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    failure: str | None = None
    _deaths: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # thread loops die together

    def died(self, loop: str, exc: BaseException, now: float | None = None) -> float | None:
        """Record that ``loop`` raised ``exc`` (at monotonic ``now``); the seconds to wait
        before starting it again, or None if it died too often and the worker must stop."""
        now = time.monotonic() if now is None else now
        with self._lock:
            deaths = [t for t in self._deaths.get(loop, []) if now - t < self.policy.window_s]
            deaths.append(now)
            self._deaths[loop] = deaths
            self.counters.internal_errors += 1
            given_up = len(deaths) >= self.policy.max_deaths
            if given_up and self.failure is None:
                self.failure = printable(
                    f"the {loop} died {len(deaths)} times within "
                    f"{self.policy.window_s:g}s; last error: {_summary(exc)}"
                )
            if not given_up:
                self.counters.loop_restarts += 1
        trace = printable(describe(exc), keep_newlines=True)
        if given_up:
            log.critical("delayq worker: %s; stopping the worker\n%s", self.failure, trace)
            return None
        backoff = self.policy.first_backoff_s * 2.0 ** (len(deaths) - 1)
        delay = min(backoff, self.policy.max_backoff_s)
        log.error(
            "delayq worker: the %s died (%s); restarting it in %.2fs\n%s",
            loop, printable(_summary(exc)), delay, trace,
        )  # fmt: skip
        return delay

    def raise_if_failed(self) -> None:
        """End ``run()`` with :class:`WorkerFailed` if a loop could not be kept running."""
        if self.failure is not None:
            raise WorkerFailed(f"delayq worker stopped: {self.failure}")


def _summary(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a __str__ that raises
        text = ""
    return f"{type(exc).__qualname__}: {text}" if text else type(exc).__qualname__


def internal_error_text(exc: BaseException) -> str:
    """The last error recorded on a task that the worker itself failed on (not its handler)."""
    return utf8_safe(f"delayq worker internal error: {describe(exc)}")


def with_policies(
    queues: Sequence[Any],
    visibility_timeout: Duration | None,
    max_attempts: int | None,
    retry_backoff: Any,
) -> list[Any]:
    """The queues as this worker hands their tasks out: views with the worker's own lease and
    retry settings where it has any (the queues given are left as they were)."""
    if visibility_timeout is None and max_attempts is None and retry_backoff is None:
        return list(queues)
    return [
        queue.with_policy(
            visibility_timeout=visibility_timeout,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
        )
        for queue in queues
    ]


def check_handler(handler: Any, wants_coroutine: bool) -> None:
    """Refuse a handler of the wrong kind before any task is taken: a coroutine function in
    threads would be acked unrun, a plain one awaited would fail after its side effects."""
    if not callable(handler):
        raise ConfigError(f"the handler must be callable, got {handler!r}")
    inner = _unwrapped(handler)  # a partial is named by the function it wraps
    name = printable(getattr(inner, "__qualname__", type(inner).__qualname__))
    if wants_coroutine and not is_coroutine_function(handler):
        raise ConfigError(
            f"AsyncWorker needs an async def handler; {name} is a plain function (a decorator "
            "that hides an async def must itself be async def): "
            "run it with Worker (threads), or make it async def"
        )
    if not wants_coroutine and is_coroutine_function(handler):
        raise ConfigError(
            f"Worker runs plain functions in threads; {name} is async def: "
            "run it with AsyncWorker, or make it a plain def"
        )


def is_coroutine_function(handler: Any) -> bool:
    """Whether calling ``handler`` makes a coroutine: an async def, a partial of one, or an
    object whose ``__call__`` is one."""
    handler = _unwrapped(handler)
    if inspect.iscoroutinefunction(handler):
        return True
    call = type(handler).__call__  # an object with an async __call__
    return not inspect.isroutine(handler) and inspect.iscoroutinefunction(call)


def _unwrapped(handler: Any) -> Any:
    """The function a ``functools.partial`` (of a partial ...) calls; anything else as is."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    return handler


class WorkerBase:
    """State and health reporting shared by :class:`Worker` and :class:`AsyncWorker`."""

    _queues: list[Any]
    _ledger: Ledger[Any]
    _wants_coroutine: bool  # AsyncWorker: handlers are async def
    _ack_ready: Any  # set when acks are due (an asyncio or a threading Event)
    # Held around the ledger and a run's flags: the thread worker's lock; the asyncio worker
    # needs none (one thread).
    _guard: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def _setup(
        self,
        queues: list[Any],
        handler: Any,
        options: WorkerOptions,
        handle_signals: bool,
        hooks: Hooks | None,
        policy: tuple[Duration | None, int | None, Any],
        metrics: WorkerRecorder | None = None,
    ) -> None:
        check_handler(handler, wants_coroutine=self._wants_coroutine)
        self._queues = with_policies(queues, *policy)
        self._policies = [q.policy for q in self._queues]  # read once: the hot path reads them
        # A fetch waits at most this long for news, so that a stop is noticed soon.
        self._poll_timeout = [min(p.safety_interval, 0.5) for p in self._policies]
        self._metrics: WorkerRecorder = NOOP if metrics is None else metrics
        self._handler = handler
        self._options = options
        self._handle_signals = handle_signals
        self._hooks = hooks or Hooks()
        self._counters = Counters()
        # Whether handlers run in spans: looked at once per fetch, not per task (the check
        # costs about 1 % of a task's client CPU): a tracer provider set after the start
        # applies from the next batch fetched.
        self._traced = False
        self._state = "starting"
        self._ledger = Ledger(len(queues), Pace.of(options.handlers[0], options.prefetch))
        self._signals = 0
        self._supervisor = LoopSupervisor(self._counters)
        self._health_error: str | None = None
        names = [q.name for q in self._queues]
        self._fetch_trouble = [RedisTrouble(f"fetch from {n}", n) for n in names]
        self._ack_trouble = [RedisTrouble(f"acks on {n}", n) for n in names]
        self._heartbeat_trouble = [RedisTrouble(f"lease heartbeat on {n}", n) for n in names]

    def _start_by(self, index: int, confirmed_at: float) -> float | None:
        """Until when a waiting task of queue ``index`` whose lease Redis last confirmed at
        ``confirmed_at`` (monotonic) may still be begun: its lease less a margin (a fifth,
        at most 1 s) for the clocks and the round trip; None without leases. Heartbeats
        keep two thirds of the lease ahead, so only a lease no extension reached comes
        near it."""
        lease_s: float | None = self._policies[index].visibility_timeout
        if lease_s is None:
            return None
        return confirmed_at + lease_s - min(1.0, lease_s / 5)

    def _report_lapsed(self, queue_name: str, tasks: Sequence[Any]) -> None:
        for task in tasks:
            log.warning(
                "delayq worker: lease on %s of %s ran out while it waited in the buffer (no "
                "extension got through): not run; it is or will be delivered again",
                printable(task.id), queue_name,
            )  # fmt: skip

    def _forget_troubles(self) -> None:
        """The worker stopped: its loops wait on no outage (outages.py)."""
        for trouble in [*self._fetch_trouble, *self._ack_trouble, *self._heartbeat_trouble]:
            trouble.close()

    def health(self) -> WorkerHealth:
        """Whether the worker is alive (running, every loop kept going, fetching recently; if
        not, ``reason`` says why) and when it last made progress."""
        return health_of(
            self._state, self._counters, self._ledger.busy(), self._queues,
            self._supervisor.failure,
        )  # fmt: skip

    def _write_health(self) -> None:
        if not self._options.health_file:
            return
        try:
            write_health_file(self._options.health_file, self.health())
        except OSError as exc:  # a full disk must not stop the work; say so once per cause
            if str(exc) != self._health_error:
                self._health_error = str(exc)
                log.warning("delayq worker: cannot write the health file: %s", printable(exc))
        else:
            self._health_error = None

    def _loop_died(self, loop: str, queue: str, exc: BaseException) -> float | None:
        """A supervised loop raised: meter it and ask the supervisor whether to restart it."""
        with contextlib.suppress(Exception):
            self._metrics.internal_error(queue, f"{loop} loop")
        return self._supervisor.died(f"{loop} loop of {queue}" if queue else f"{loop} loop", exc)

    def _judged(
        self, name: str, run: Any, error: BaseException | None, result: Any, now: float
    ) -> Outcome | None:
        """The handler's verdict on ``run``, logged and counted. An ack is booked here (None
        returned: the ack loop sends it); a failure's task is handed back to the ledger, and
        the caller records the outcome in Redis (:meth:`_failure_call`), then
        :meth:`_failure_done`."""
        task, duration = run.task, now - run.started
        outcome = outcome_of(error, task.attempts, self._policies[run.index].max_attempts)
        log_outcome(log, name, task, outcome, duration)
        self._counters.processed_one(now)
        if outcome.verdict is Verdict.ACK:
            self._counters.succeeded += 1
            with self._guard:
                run.settled = True
                due = self._ledger.done(run, now)
            if due and not self._ack_ready.is_set():
                self._ack_ready.set()
            self._metrics.task_done(name, task, "acked", duration)
            if self._hooks.on_success is not None:
                call_hook(log, self._hooks.on_success, task, result, duration)
            return None
        if outcome.verdict is not Verdict.THROTTLE:  # [L] a downstream's limit: no failure
            self._counters.failed += 1
        with self._guard:
            self._ledger.given_back(run.index, task)
        return outcome

    @staticmethod
    def _failure_call(queue: Any, task: Any, outcome: Outcome) -> tuple[Any, tuple[Any, ...]]:
        """The queue's method that records ``outcome`` in Redis, and its arguments."""
        if outcome.verdict is Verdict.THROTTLE:
            return queue.throttle, (task, outcome.delay or 0)
        if outcome.verdict is Verdict.REJECT:
            return queue.reject, (task, outcome.error)
        return functools.partial(queue.retry, error=outcome.error), (task, outcome.delay)

    def _failure_done(
        self,
        name: str,
        run: Any,
        outcome: Outcome,
        error: BaseException | None,
        recorded: BaseException | None,
        now: float,
    ) -> None:
        """After :meth:`_failure_call`: ``recorded`` is None if Redis took the outcome, else
        the :class:`~delayq.DelayqError` it raised (the task then comes back by its lease)."""
        task = run.task
        run.settled = True
        if recorded is None and outcome.verdict is Verdict.THROTTLE:
            self._metrics.task_done(name, task, "throttled", now - run.started)
            return
        if recorded is None:
            label = "dead" if outcome.dead else "retried"
        elif isinstance(recorded, LeaseLost):
            label = "failed"  # not recorded: the task comes back when its lease expires
            log.warning(
                "delayq worker: lease on %s lost before its failure was recorded",
                printable(task.id),
            )
        else:
            label = "failed"
            log.warning(
                "delayq worker: could not record failure of %s: %s",
                printable(task.id), printable(recorded),
            )  # fmt: skip
        self._metrics.task_done(name, task, label, now - run.started)
        call_hook(log, self._hooks.on_failure, task, error)
        if outcome.dead:
            self._counters.dead += 1
            call_hook(log, self._hooks.on_dead, task, error)

    def _taken_back(self, queue: str, run: Any, where: str, exc: BaseException) -> bool:
        """The worker's own code failed on ``run``: log and count it; True if its verdict did
        not go to Redis yet, and the caller is to retry the task (:meth:`_not_retried`)."""
        self._internal_error(where, queue, run.task.id, exc)
        with self._guard:
            if run.settled:
                return False
            run.settled = True
            self._ledger.given_back(run.index, run.task)
        return True

    @staticmethod
    def _not_retried(task: Any, exc: BaseException) -> None:
        if not isinstance(exc, LeaseLost):  # a lost lease: it already comes back by it
            log.warning(
                "delayq worker: could not retry %s after an internal error (%s); it comes "
                "back when its lease expires", printable(task.id), printable(exc),
            )  # fmt: skip

    def _internal_error(self, where: str, queue: str, task_id: object, exc: BaseException) -> None:
        """Log (once, with the task id), count and meter a failure of the worker's own code
        while it handled one task (``task_id`` None: while it shut down); the caller then
        retries the task or leaves it to its lease."""
        self._counters.internal_errors += 1
        with contextlib.suppress(Exception):  # a broken recorder must not add an error
            self._metrics.internal_error(queue, where)
        subject = "" if task_id is None else f" on task {printable(task_id)} of {queue}"
        log.error(
            "delayq worker: internal error (%s)%s: %s\n%s",
            where, subject, printable(_summary(exc)),
            printable(describe(exc), keep_newlines=True),
        )  # fmt: skip
