"""Prometheus metrics of the outbox and a relay (the metrics extra), read at each scrape:

- ``delayq_outbox_pending{prefix,queue}``: rows committed and not relayed yet;
- ``delayq_outbox_dead{prefix,queue}``: rows no relay could apply;
- ``delayq_outbox_lag_seconds{prefix,queue}``: age of the oldest pending row (0 when none),
  on the database's clock: how far the relays are behind;
- ``delayq_outbox_missed{prefix,queue}``: cancels and reschedules that found no waiting task;
- ``delayq_outbox_relayed_total{op}``, ``delayq_outbox_relay_dead_total``: this relay's work;
- ``delayq_outbox_relay_missed_total``, ``delayq_outbox_relay_refused_total``: its cancels
  and reschedules that found no task, and rows claimed again that Redis refused (applied
  before: a failed commit or a relay that died);
- ``delayq_outbox_relay_last_lag_seconds``: commit to Redis for the last batch it relayed.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..metrics._base import require_prometheus

if TYPE_CHECKING:
    from ..metrics._serve import MetricsServer
    from ._relay import RelayStats
    from ._sync.outbox import Outbox
    from ._values import QueueBacklog

log = logging.getLogger("delayq.outbox")


# Queues with series of their own at most; the rest are summed under queue="_other", so that
# a table with 50,000 queue names costs a scrape a few hundred series, not 150,000.
DEFAULT_MAX_QUEUES = 100
OTHER = "_other"


class OutboxCollector:
    """A prometheus-client collector: the outbox table's backlog (one query per scrape) and,
    if given, one relay's counters. The ``max_queues`` queues with the most rows get series
    of their own; the others are summed under ``prefix="", queue="_other"``."""

    def __init__(
        self, outbox: Outbox, stats: RelayStats | None = None, max_queues: int = DEFAULT_MAX_QUEUES
    ) -> None:
        if not isinstance(max_queues, int) or isinstance(max_queues, bool) or max_queues < 1:
            raise ValueError(f"max_queues must be an int >= 1, got {max_queues!r}")
        self._outbox = outbox
        self._stats = stats
        self._max_queues = max_queues
        # Queues given series of their own, in order: one whose rows were all relayed reads 0
        # instead of vanishing (a series that vanishes is a gap in a graph, and an alert on
        # it neither fires nor resolves).
        self._shown: dict[tuple[str, str], None] = {}

    def _emptied(
        self, own: list[QueueBacklog], rest: list[QueueBacklog], read: bool
    ) -> list[tuple[str, str]]:
        """The queues shown before that hold no rows now, as many as fit beside ``own``
        under the bound (the oldest are forgotten first)."""
        if not read:  # the table could not be read: no figure rather than a false 0
            return []
        present = {(q.prefix, q.queue) for q in (*own, *rest)}
        emptied = [labels for labels in self._shown if labels not in present]
        emptied = emptied[max(0, len(emptied) - (self._max_queues - len(own))) :]
        self._shown = dict.fromkeys([*emptied, *((q.prefix, q.queue) for q in own)])
        return emptied

    def collect(self) -> Iterator[Any]:
        require_prometheus()
        core = importlib.import_module("prometheus_client.core")
        labels = ["prefix", "queue"]
        pending = core.GaugeMetricFamily(
            "delayq_outbox_pending", "Outbox rows committed and not relayed yet.", labels=labels
        )
        dead = core.GaugeMetricFamily(
            "delayq_outbox_dead", "Outbox rows no relay could apply.", labels=labels
        )
        lag = core.GaugeMetricFamily(
            "delayq_outbox_lag_seconds",
            "Age of the oldest pending outbox row (database clock).",
            labels=labels,
        )
        missed = core.GaugeMetricFamily(
            "delayq_outbox_missed",
            "Outbox cancels and reschedules that found no waiting task.",
            labels=labels,
        )
        try:
            status = self._outbox.status()
        except Exception as exc:  # a scrape must not fail because the database is away
            log.warning("outbox metrics: cannot read the table: %s", exc)
            status = None
        queues = sorted(
            status.queues if status else (),
            key=lambda q: q.pending + q.dead + q.missed,
            reverse=True,
        )
        own, rest = queues[: self._max_queues], queues[self._max_queues :]
        for q in own:
            pending.add_metric([q.prefix, q.queue], q.pending)
            dead.add_metric([q.prefix, q.queue], q.dead)
            lag.add_metric([q.prefix, q.queue], q.oldest_pending_age or 0.0)
            missed.add_metric([q.prefix, q.queue], q.missed)
        for prefix, queue in self._emptied(own, rest, status is not None):
            for family in (pending, dead, lag, missed):
                family.add_metric([prefix, queue], 0.0)
        if rest:
            other = ["", OTHER]
            pending.add_metric(other, sum(q.pending for q in rest))
            dead.add_metric(other, sum(q.dead for q in rest))
            lag.add_metric(other, max(q.oldest_pending_age or 0.0 for q in rest))
            missed.add_metric(other, sum(q.missed for q in rest))
        yield from (pending, dead, lag, missed)
        if self._stats is None:
            return
        relayed = core.CounterMetricFamily(
            "delayq_outbox_relayed", "Rows this relay applied to Redis.", labels=["op"]
        )
        relayed.add_metric(["offer"], self._stats.offered)
        relayed.add_metric(["cancel"], self._stats.cancelled)
        relayed.add_metric(["reschedule"], self._stats.rescheduled)
        buried = core.CounterMetricFamily(
            "delayq_outbox_relay_dead", "Rows this relay marked dead."
        )
        buried.add_metric([], self._stats.dead)
        last = core.GaugeMetricFamily(
            "delayq_outbox_relay_last_lag_seconds",
            "Commit to Redis for the oldest row of this relay's last batch.",
        )
        last.add_metric([], self._stats.last_lag_s or 0.0)
        not_found = core.CounterMetricFamily(
            "delayq_outbox_relay_missed",
            "Cancels and reschedules of this relay that found no waiting task.",
        )
        not_found.add_metric([], self._stats.missing)
        refused = core.CounterMetricFamily(
            "delayq_outbox_relay_refused",
            "Rows this relay claimed again that Redis refused as applied before.",
        )
        refused.add_metric([], self._stats.duplicates)
        yield from (relayed, buried, last, not_found, refused)


def serve_relay_metrics(
    outbox: Outbox, stats: RelayStats | None, port: int, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve the outbox's (and a relay's) metrics on ``http://host:port/metrics``."""
    prometheus = require_prometheus()
    from ..metrics._serve import MetricsServer

    registry = prometheus.CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(outbox, stats))
    return MetricsServer(registry, host, port)
