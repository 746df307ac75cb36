"""Queue-level metrics read from Redis at scrape time by a custom collector."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from .._core import protocol, sharding
from .._core.keys import QueueKeys
from .._core.limits import EXPORTER_TOTAL, THROTTLE_REASONS
from .._core.models import Stats
from .._core.outages import OUTAGES, where_of
from .._core.timing import Duration, duration_ms
from .._sync.connection import Connection, shared_or_new
from ..exceptions import DelayqError
from . import _schedules

log = logging.getLogger("delayq.metrics")

CLIENT_NAME = "delayq-exporter"
DEFAULT_RECONNECT_S = 3.0  # a scrape rides out a short blip, then reports delayq_exporter_up 0
# Queues a scrape gives series of their own; the rest are summed under queue="_other", so
# 50,000 queue names cost a few hundred series, not hundreds of thousands.
MAX_QUEUES = 200
OTHER = "_other"

STATES = ("delayed", "ready", "inflight", "expired", "dead")
# Redis counters hash field (= metric name without delayq_ and _total) -> help text.
COUNTERS = {
    "offered": "Tasks offered (scheduled).",
    "delivered": "Deliveries to consumers (a retried task counts once per delivery).",
    "acked": "Tasks acknowledged as done.",
    "retried": "Failed attempts given back for another delivery.",
    "dead_lettered": "Tasks moved to the dead-letter set.",
    "cancelled": "Tasks cancelled before delivery.",
    "expired": "Tasks dropped because their ttl passed before delivery.",
    "lease_expired": "Leases that expired before an ack (the task was delivered again or died).",
    "decode_failures": "Stored tasks that could not be decoded (dead-lettered).",
    "requeued": "Dead-lettered tasks put back on the queue.",
    "purged": "Tasks deleted by purge.",
}


# A Stats from one reply of the stats script, as the queues' own stats() builds it.
stats_of = protocol.stats_from_reply


class QueueCollector(Collector):
    """Reads the stats of delayq queues from Redis on every scrape.

    ``redis``: a URL, a client, or a connection handle (:func:`delayq.connect`, shared
    with the rest of the program and left open by :meth:`close`). ``queues``: the names to
    report; None reads the registry set ``<prefix>:queues`` on each scrape (every queue ever
    offered to). One scrape costs one ``SMEMBERS`` (only without ``queues``), one ``HGETALL``
    of the sharded queues' layouts and one pipelined round of ``stats`` script calls per
    Redis node, each O(log N): no scans. ``overdue_after``
    (seconds) is the overdue threshold, as the queues' own option. ``reconnect_timeout``:
    how long a scrape rides out a blip before it reports ``delayq_exporter_up 0`` (None: 3 s,
    or the handle's own); ``prefix`` None: the handle's, else ``"dq"``.

    When Redis does not answer, the scrape still succeeds with ``delayq_exporter_up 0`` and
    no queue samples. An outage is logged once for the process, at its start (a warning with
    the error) and at its end (an info line, "available again", with how long it lasted):
    a scrape every 15 s must not write a line every 15 s (see ``_core/outages.py``).
    """

    def __init__(
        self,
        redis: Any = None,
        *,
        prefix: str | None = None,
        queues: Iterable[str] | None = None,
        overdue_after: float = 1.0,
        reconnect_timeout: Duration | None = None,
        max_queues: int = MAX_QUEUES,
    ) -> None:
        if not isinstance(max_queues, int) or max_queues < 1:
            raise ValueError(f"max_queues must be a positive int, not {max_queues!r}")
        self.max_queues = max_queues
        if reconnect_timeout is None and not isinstance(redis, Connection):
            reconnect_timeout = DEFAULT_RECONNECT_S
        self._conn, self._owns_conn = shared_or_new(
            redis, reconnect_timeout=reconnect_timeout, prefix=prefix, client_name=CLIENT_NAME
        )
        self.prefix = self._conn.prefix
        self.queues = None if queues is None else [QueueKeys(self.prefix, n).name for n in queues]
        duration_ms(overdue_after, "overdue_after")  # validates it
        self._overdue_after = overdue_after
        self._outage_where: str | None = None  # the Redis a failed scrape could not read
        self._outage_lock = threading.Lock()  # scrapes may run on several server threads

    @property
    def runner(self) -> Any:
        """The sync runner of the collector's Redis handle (for plain commands)."""
        return self._conn.runner

    def close(self) -> None:
        """Close the Redis connections if this collector made them (not a handle passed in)."""
        OUTAGES.forget(self)
        if self._owns_conn:
            self._conn.close()

    # -- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The queues a scrape reports: the given ones or the registry's valid names."""
        if self.queues is not None:
            return list(self.queues)
        return self._conn.queues()

    def read(self) -> list[Stats]:
        """The stats of every reported queue, in one round trip per Redis node (raises
        :class:`RedisUnavailable` or :class:`ServerError`). A sharded queue's shards are read
        in the same round and summed, each shard in ``Stats.shards``."""
        return self._conn.stats(self.queues, overdue_after=self._overdue_after)

    # -- prometheus -------------------------------------------------------------------------

    def snapshot(self) -> tuple[list[Stats], bool, float, list[Any]]:
        """One scrape's reading: the stats, whether Redis answered, the seconds it took and
        the replies of the schedule reads (one per (sub-)queue)."""
        started = time.perf_counter()
        try:
            rows, up = self.read(), True
            schedules = self._conn.runner.many(_schedules.calls(self.prefix, rows))
        except (DelayqError, RedisError, OSError) as exc:
            self._failed(exc)
            rows, up, schedules = [], False, []
        else:
            self._recovered()
        return rows, up, time.perf_counter() - started, schedules

    def _failed(self, exc: BaseException) -> None:
        with self._outage_lock:
            self._outage_where = where_of(exc, f"prefix {self.prefix!r}")
            where = self._outage_where
        # One warning for the process (_core/outages.py): the connection layer's calls fail
        # in the same outage.
        OUTAGES.lost(where, self, exc, "scrapes (delayq_exporter_up 0)")

    def _recovered(self) -> None:
        with self._outage_lock:
            where, self._outage_where = self._outage_where, None
        if where is not None:
            OUTAGES.back(where, self)

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() (and Redis) on registration.
        for name, kind, text in FAMILIES:
            yield Metric(name, text, kind)

    def _samples(self) -> list[list[tuple[str, Labels, float]]]:
        return grouped(*self.snapshot(), max_queues=self.max_queues)

    def collect(self) -> Iterator[Metric]:
        """The metrics as prometheus-client objects (when registered on a registry)."""
        for (name, kind, text), samples in zip(
            FAMILIES, grouped(*self.snapshot(), max_queues=self.max_queues), strict=True
        ):
            family = Metric(name, text, kind)
            for sample, labels, value in samples:
                family.add_sample(sample, dict(labels), value)
            yield family

    def render(self) -> str:
        """The metrics in the Prometheus text format, written directly: one scrape of many
        queues is thousands of samples, and prometheus-client's generic exposition of them
        costs several times the Redis round (see bench/exporter.py)."""
        out: list[str] = []
        for (name, kind, text), samples in zip(
            FAMILIES, grouped(*self.snapshot(), max_queues=self.max_queues), strict=True
        ):
            if kind == "counter":
                name += "_total"  # text format 0.0.4 names counters by their samples
            out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
            for sample, labels, value in samples:
                if labels:
                    pairs = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
                    out.append(f"{sample}{{{pairs}}} {_number(value)}\n")
                else:
                    out.append(f"{sample} {_number(value)}\n")
        return "".join(out)


Labels = tuple[tuple[str, str], ...]

# (name, type, help) of every family, in exposition order. Counter names lack the "_total"
# that their samples carry, as the text format wants.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("delayq_tasks", "gauge", "Tasks stored, by state."),
    ("delayq_overdue_tasks", "gauge", "Due tasks waiting longer than overdue_after."),
    (
        "delayq_oldest_overdue_age_seconds",
        "gauge",
        "How long the oldest due task has waited to be taken; 0 if none is due.",
    ),
    (
        "delayq_next_due_timestamp_seconds",
        "gauge",
        "Unix time the next not-yet-due task falls due (absent when none).",
    ),
    (
        "delayq_consumer_last_seen_timestamp_seconds",
        "gauge",
        "Unix time a consumer last fetched from the queue (absent when never).",
    ),
    *((f"delayq_{name}", "counter", text) for name, text in COUNTERS.items()),
    (
        "delayq_delivery_lateness_seconds",
        "histogram",
        "Delivery time minus due time of every delivery, on Redis's clock, all consumers.",
    ),
    (
        "delayq_shard_tasks",
        "gauge",
        "Tasks stored in each shard of a sharded queue, by state (summed in delayq_tasks).",
    ),
    # [L] flow control (issue #20); per-key series for the 10 keys with the most, and _all
    ("delayq_queue_paused", "gauge", "1 while the queue is paused (q.pause()), else 0."),
    (
        "delayq_limit_waiting",
        "gauge",
        "Tasks parked by a limit, per limit key (top 10; key _all: the queue's total).",
    ),
    (
        "delayq_limit_running",
        "gauge",
        "Leases held per limit key (top 10; key _all: every lease under limits).",
    ),
    (
        "delayq_limit_throttled",
        "counter",
        "Tasks held back, by reason: rate, concurrency (each time their key is held back "
        "while they wait), ratelimited (a handler's RateLimited); per key for the 10 keys "
        "held back most, key _all: the queue's total.",
    ),
    ("delayq_exporter_up", "gauge", "1 if Redis answered this scrape, else 0."),
    (
        "delayq_exporter_scrape_duration_seconds",
        "gauge",
        "Time this scrape spent reading queue stats from Redis.",
    ),
    *_schedules.SCHEDULE_FAMILIES,
)


def bounded(rows: Sequence[Stats], most: int) -> list[Stats]:
    """``rows`` if there are at most ``most``; else the ``most - 1`` that need someone first
    (overdue, then dead, then the most tasks) and one row ``_other`` summing the rest."""
    if len(rows) <= most:
        return list(rows)
    ranked = sorted(rows, key=lambda r: (-r.overdue, -r.dead, -r.total, r.queue))
    shown, rest = ranked[: most - 1], ranked[most - 1 :]
    other = sharding.merged_stats(OTHER, rest)
    totals = {"": other.limit_waiting.get("", 0)}, {"": other.limit_running.get("", 0)}
    return [
        *shown,
        replace(
            other,
            shards=(),
            limit_waiting=totals[0],
            limit_running=totals[1],
            limit_throttled={},  # per key of many queues: unbounded; the counters keep totals
        ),
    ]


def grouped(
    rows: Sequence[Stats],
    up: bool,
    seconds: float,
    schedules: Sequence[Any] = (),
    *,
    max_queues: int = MAX_QUEUES,
) -> list[list[tuple[str, Labels, float]]]:
    """The samples of each family of :data:`FAMILIES` (same order): (name, labels, value);
    at most ``max_queues`` queues get series of their own (:func:`bounded`)."""
    out: list[list[tuple[str, Labels, float]]] = [
        [] for _ in FAMILIES[: -len(_schedules.SCHEDULE_FAMILIES)]
    ]
    (tasks, overdue, oldest, next_due, seen, *counters, lateness, shard_tasks,
     paused, waiting, running_keys, throttled, up_, duration) = out  # fmt: skip
    out += (
        _schedules.samples(rows, schedules) if rows else [[] for _ in _schedules.SCHEDULE_FAMILIES]
    )
    for stats in bounded(rows, max_queues):
        q = (("queue", stats.queue),)
        for state in STATES:
            tasks.append(("delayq_tasks", (*q, ("state", state)), getattr(stats, state)))
        overdue.append(("delayq_overdue_tasks", q, stats.overdue))
        oldest.append(("delayq_oldest_overdue_age_seconds", q, stats.oldest_overdue_age))
        if stats.next_due_at is not None:
            next_due.append(("delayq_next_due_timestamp_seconds", q, stats.next_due_at.timestamp()))
        if stats.consumer_seen_at is not None:
            seen.append(
                (
                    "delayq_consumer_last_seen_timestamp_seconds",
                    q,
                    stats.consumer_seen_at.timestamp(),
                )
            )
        for samples, field in zip(counters, COUNTERS, strict=True):
            samples.append((f"delayq_{field}_total", q, stats.counters.get(field, 0)))
        running = 0
        for bound in sorted(stats.lateness):
            running += stats.lateness[bound]
            le = (("le", "+Inf" if math.isinf(bound) else repr(float(bound))),)
            lateness.append(("delayq_delivery_lateness_seconds_bucket", (*q, *le), running))
        if not stats.lateness or not math.isinf(max(stats.lateness)):
            lateness.append(
                ("delayq_delivery_lateness_seconds_bucket", (*q, ("le", "+Inf")), running)
            )
        lateness.append(("delayq_delivery_lateness_seconds_count", q, running))
        lateness.append(("delayq_delivery_lateness_seconds_sum", q, stats.lateness_sum))
        for index, shard in enumerate(stats.shards):
            labels = (*q, ("shard", str(index)))
            for state in STATES:
                shard_tasks.append(
                    ("delayq_shard_tasks", (*labels, ("state", state)), getattr(shard, state))
                )
        paused.append(("delayq_queue_paused", q, 1 if stats.paused else 0))  # [L]
        for gauge, name in (
            (waiting, "delayq_limit_waiting"),
            (running_keys, "delayq_limit_running"),
        ):
            values = stats.limit_waiting if gauge is waiting else stats.limit_running
            for key, value in values.items():
                gauge.append((name, (*q, ("key", key or EXPORTER_TOTAL)), value))
        for reason in THROTTLE_REASONS:
            value = stats.counters.get(f"throttled:{reason}", 0)
            per_key = {**stats.limit_throttled.get(reason, {}), EXPORTER_TOTAL: value}
            for key, held in per_key.items():
                key_labels = (*q, ("key", key or EXPORTER_TOTAL), ("reason", reason))
                throttled.append(("delayq_limit_throttled_total", key_labels, held))
    up_.append(("delayq_exporter_up", (), 1 if up else 0))
    duration.append(("delayq_exporter_scrape_duration_seconds", (), seconds))
    return out


def _label(value: str) -> str:
    """A label value as the text format writes it (a limit key may hold any character)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
