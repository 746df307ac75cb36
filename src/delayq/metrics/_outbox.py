"""Outbox health for ``delayq exporter --dsn``: what an operator alerts on, with a sample at
every scrape even when the table is empty or no relay runs (a relay's own ``--metrics-port``
dies with the relay, and its per-queue gauges have no samples for an empty table):

- ``delayq_outbox_up{table}``: 1 if the database answered this scrape, else 0;
- ``delayq_outbox_pending_rows{table}``, ``delayq_outbox_dead_rows{table}``;
- ``delayq_outbox_oldest_pending_age_seconds{table}``: 0 when nothing waits;
- ``delayq_outbox_relays_alive{table}``: relays whose heartbeat vouches for them now
  (``outbox/_heartbeat.py``; no sample while Redis does not answer).

One status query and two Redis commands per scrape. A database outage is logged once at its
start and once at its end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._core.text import printable
from .._core.urls import mask_secrets

log = logging.getLogger("delayq.metrics")


class OutboxHealthCollector:
    """A prometheus-client collector of one outbox table's health (see the module)."""

    def __init__(self, dsn: str, runner: Any, table: str = "delayq_outbox",
                 schema: str | None = None) -> None:  # fmt: skip
        # The postgres extra: only an exporter given --dsn. (Its modules, not the package,
        # whose relay metrics import this package's server.)
        from ..outbox._schema import Schema
        from ..outbox._sync.outbox import Outbox

        self._outbox = Outbox(dsn, table=table, schema=schema)
        self._schema = Schema(table, schema)
        self._runner = runner  # a sync runner (the exporter's Redis handle)
        self.table = self._schema.channel
        self._down_since: float | None = None
        self._lock = threading.Lock()  # scrapes may run on several server threads

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from ..outbox._heartbeat import live_relays

        def gauge(name: str, text: str, value: float) -> Any:
            family = GaugeMetricFamily(name, text, labels=["table"])
            family.add_metric([self.table], value)
            return family

        try:
            status = self._outbox.status()
        except Exception as exc:  # the database away, or the table missing
            self._database(exc)
            status = None
        else:
            self._database(None)
        yield gauge("delayq_outbox_up", "1 if the outbox database answered.", status is not None)
        if status is not None:
            yield gauge(
                "delayq_outbox_pending_rows", "Outbox rows not relayed yet.", status.pending
            )
            yield gauge("delayq_outbox_dead_rows", "Outbox rows no relay could apply.", status.dead)
            yield gauge(
                "delayq_outbox_oldest_pending_age_seconds",
                "Age of the oldest pending outbox row (database clock); 0 if none.",
                status.oldest_pending_age or 0.0,
            )
        try:
            alive = len(live_relays(self._runner, self._schema))
        except Exception as exc:  # Redis away: the queue metrics say so (delayq_exporter_up)
            log.debug("delayq exporter: cannot read the relays' heartbeats: %s", exc)
            return
        yield gauge(
            "delayq_outbox_relays_alive", "Relays whose heartbeat vouches for them now.", alive
        )

    def _database(self, error: BaseException | None) -> None:
        with self._lock:
            since = self._down_since
            if error is not None and since is None:
                self._down_since = time.monotonic()
            elif error is None:
                self._down_since = None
        if error is not None and since is None:
            log.warning(
                "delayq exporter: cannot read the outbox %s (%s); delayq_outbox_up 0 until it "
                "answers", self.table, printable(mask_secrets(" ".join(str(error).split()))),
            )  # fmt: skip
        elif error is None and since is not None:
            log.info(
                "delayq exporter: the outbox %s is readable again after %.1f s",
                self.table, time.monotonic() - since,
            )  # fmt: skip
