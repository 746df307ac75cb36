"""Worker-side metrics: what a worker process sees of its own tasks, recorded in-process."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ._base import BUCKETS_S, OUTCOMES


class WorkerMetrics:
    """Prometheus metrics of one worker, registered on ``registry`` (default: the global one).

    Pass it as ``metrics=`` to :class:`~delayq.Worker` or :class:`~delayq.AsyncWorker`. Create
    one per registry: registering the same names twice on a registry is an error. Tests and
    applications that serve their own endpoint pass a fresh ``CollectorRegistry()``.

    End-to-end time is measured from the task's due time (the envelope keeps no enqueue
    time), on Redis's clock: the offset between this host's clock and Redis's is taken from
    each fetch (``delivered_ms`` is the server's time), so a skewed host clock does not skew it.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self.registry = registry
        self.lateness = Histogram(
            "delayq_worker_lateness_seconds",
            "Time from a task's due time to its delivery to this worker (Redis clock).",
            ["queue"], buckets=BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.handler_duration = Histogram(
            "delayq_worker_handler_duration_seconds",
            "Time a handler ran, by outcome.",
            ["queue", "outcome"], buckets=BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.end_to_end = Histogram(
            "delayq_worker_end_to_end_seconds",
            "Time from a task's due time until its handler finished.",
            ["queue"], buckets=BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.tasks = Counter(
            "delayq_worker_tasks",
            "Handler runs finished by this worker, by outcome.",
            ["queue", "outcome"], registry=registry,
        )  # fmt: skip
        self.in_progress = Gauge(
            "delayq_worker_in_progress",
            "Handlers running now.",
            ["queue"], registry=registry,
        )  # fmt: skip
        self.last_heartbeat = Gauge(
            "delayq_worker_last_heartbeat_timestamp_seconds",
            "Unix time of the last turn of the worker's fetch loop for the queue.",
            ["queue"], registry=registry,
        )  # fmt: skip
        self.up = Gauge(
            "delayq_worker_up",
            "1 while the worker runs on the queue, 0 once it stopped.",
            ["queue"], registry=registry,
        )  # fmt: skip
        self.internal_errors = Counter(
            "delayq_worker_internal_errors",
            "Failures of the worker's own code (not of handlers), by queue and where they "
            "happened ('' queue: a loop shared by every queue).",
            ["queue", "where"], registry=registry,
        )  # fmt: skip
        # Redis clock minus this host's clock, per queue, as of the latest fetch.
        self._offset_s: dict[str, float] = {}
        self._lock = threading.Lock()

    def worker_started(self, queues: Sequence[str]) -> None:
        now = time.time()
        for queue in queues:
            self.up.labels(queue).set(1)
            self.in_progress.labels(queue).set(0)
            self.last_heartbeat.labels(queue).set(now)
            self.lateness.labels(queue)  # the series exist (at 0) before the first task
            self.end_to_end.labels(queue)
            for outcome in OUTCOMES:
                self.tasks.labels(queue, outcome)
                self.handler_duration.labels(queue, outcome)

    def worker_stopped(self, queues: Sequence[str]) -> None:
        for queue in queues:
            self.up.labels(queue).set(0)

    def heartbeat(self, queue: str) -> None:
        self.last_heartbeat.labels(queue).set(time.time())

    def delivered(self, queue: str, tasks: Sequence[Any]) -> None:
        if not tasks:
            return
        now = time.time()
        histogram = self.lateness.labels(queue)
        for task in tasks:
            histogram.observe(max(0, task.delivered_ms - task.due_ms) / 1000)
        with self._lock:
            self._offset_s[queue] = tasks[-1].delivered_ms / 1000 - now

    def handler_started(self, queue: str) -> None:
        self.in_progress.labels(queue).inc()

    def handler_ended(self, queue: str) -> None:
        self.in_progress.labels(queue).dec()

    def internal_error(self, queue: str, where: str) -> None:
        self.internal_errors.labels(queue, where).inc()

    def task_done(self, queue: str, task: Any, outcome: str, duration_s: float) -> None:
        self.tasks.labels(queue, outcome).inc()
        self.handler_duration.labels(queue, outcome).observe(max(0.0, duration_s))
        server_now = time.time() + self._offset_s.get(queue, 0.0)
        self.end_to_end.labels(queue).observe(max(0.0, server_now - task.due_ms / 1000))
