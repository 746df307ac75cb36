"""What the workers need from metrics, without prometheus-client: the recorder interface, the
no-op recorder used when no metrics were asked for, and the missing-extra error."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol

from ..exceptions import DelayqError

INSTALL_HINT = "pip install 'delayq[metrics]'"

# Histogram bounds in seconds: milliseconds resolve at the low end, a minute at the top.
BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# The outcome label of delayq_worker_tasks_total and delayq_worker_handler_duration_seconds.
OUTCOMES = ("acked", "retried", "dead", "failed", "throttled")


class MetricsUnavailable(DelayqError, ImportError):
    """Prometheus metrics were asked for but prometheus-client is not installed."""


def require_prometheus() -> ModuleType:
    """The ``prometheus_client`` module, or :class:`MetricsUnavailable` with the fix."""
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise MetricsUnavailable(
            f"Prometheus metrics need the prometheus-client package: {INSTALL_HINT}"
        ) from exc


class WorkerRecorder(Protocol):
    """What :class:`~delayq.Worker` and :class:`~delayq.AsyncWorker` report while they run.

    Calls come from the worker's threads or event loop and must be cheap and never raise;
    :class:`delayq.metrics.WorkerMetrics` is the Prometheus implementation.
    """

    def worker_started(self, queues: Sequence[str]) -> None:
        """The worker began consuming ``queues``."""

    def worker_stopped(self, queues: Sequence[str]) -> None:
        """The worker finished its shutdown."""

    def heartbeat(self, queue: str) -> None:
        """One turn of the fetch loop of ``queue`` (whether or not it got tasks)."""

    def delivered(self, queue: str, tasks: Sequence[Any]) -> None:
        """``tasks`` (with ``due_ms`` and ``delivered_ms``) were just fetched from ``queue``."""

    def handler_started(self, queue: str) -> None:
        """A handler began on a task of ``queue``."""

    def handler_ended(self, queue: str) -> None:
        """A handler returned, raised or was cancelled (always paired with a start)."""

    def task_done(self, queue: str, task: Any, outcome: str, duration_s: float) -> None:
        """The verdict on one handler run: ``outcome`` is one of :data:`OUTCOMES`."""

    def internal_error(self, queue: str, where: str) -> None:
        """The worker's own code failed (not a handler): on a task of ``queue`` or in a loop
        (``queue`` is '' for the loops shared by every queue); ``where`` names the step."""


class NoopMetrics:
    """The recorder used when a worker was given none: every call does nothing."""

    def worker_started(self, queues: Sequence[str]) -> None:
        pass

    def worker_stopped(self, queues: Sequence[str]) -> None:
        pass

    def heartbeat(self, queue: str) -> None:
        pass

    def delivered(self, queue: str, tasks: Sequence[Any]) -> None:
        pass

    def handler_started(self, queue: str) -> None:
        pass

    def handler_ended(self, queue: str) -> None:
        pass

    def task_done(self, queue: str, task: Any, outcome: str, duration_s: float) -> None:
        pass

    def internal_error(self, queue: str, where: str) -> None:
        pass


NOOP = NoopMetrics()
