"""Prometheus metrics for delayq (the ``metrics`` extra: ``pip install 'delayq[metrics]'``).

Two sources, one naming scheme (``delayq_*``; see docs/metrics.md):

- :class:`QueueCollector` reads every queue's stats from Redis at scrape time: counts per
  state, overdue age, lifetime counters and the delivery-lateness histogram of all consumers.
  :func:`start_exporter` serves it (what ``delayq exporter`` runs).
- :class:`WorkerMetrics` is recorded in-process by a worker given ``metrics=``: lateness,
  handler time, end-to-end time and outcomes of the tasks it handled.

Importing this package does not import prometheus-client; the names above do, and raise
:class:`MetricsUnavailable` (with the install command) when it is missing. Workers without
``metrics=`` use :class:`NoopMetrics`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._base import (
    BUCKETS_S,
    INSTALL_HINT,
    NOOP,
    OUTCOMES,
    MetricsUnavailable,
    NoopMetrics,
    WorkerRecorder,
    require_prometheus,
)

if TYPE_CHECKING:
    from ._collector import QueueCollector, stats_of
    from ._serve import MetricsServer, start_exporter, start_worker_metrics
    from ._worker import WorkerMetrics

_LAZY = {
    "QueueCollector": "._collector",
    "stats_of": "._collector",
    "MetricsServer": "._serve",
    "start_exporter": "._serve",
    "start_worker_metrics": "._serve",
    "WorkerMetrics": "._worker",
}

__all__ = [
    "BUCKETS_S",
    "INSTALL_HINT",
    "NOOP",
    "OUTCOMES",
    "MetricsServer",
    "MetricsUnavailable",
    "NoopMetrics",
    "QueueCollector",
    "WorkerMetrics",
    "WorkerRecorder",
    "require_prometheus",
    "start_exporter",
    "start_worker_metrics",
    "stats_of",
]


def __getattr__(name: str) -> Any:
    """Import the prometheus-backed names on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_prometheus()
    return getattr(importlib.import_module(module, __name__), name)
