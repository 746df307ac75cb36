"""Queue-level metrics read from Redis at scrape time by a custom collector."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from .._core import protocol, sharding
from .._core.keys import QueueKeys
from .._core.models import Stats
from .._core.text import printable
from .._core.timing import duration_ms
from .._sync import runner
from ..exceptions import ConfigError, DelayqError

log = logging.getLogger("delayq.metrics")

STATES = ("delayed", "ready", "inflight", "dead")
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

    ``queues``: the names to report; None reads the registry set ``<prefix>:queues`` on each
    scrape (every queue ever offered to). One scrape costs one ``SMEMBERS`` (only without
    ``queues``) and one pipelined round of ``stats`` script calls, each O(log N): no scans.
    ``overdue_after`` (seconds) is the overdue threshold, as the queues' own option. With a
    ``RedisCluster`` client the calls go one by one (redis-py refuses EVALSHA in cluster
    pipelines), each to the node of its queue's slot.

    When Redis does not answer, the scrape still succeeds with ``delayq_exporter_up 0`` and
    no queue samples. An outage is logged once, at its first failed scrape (a warning with
    the error), and its end once (an info line, "available again", with how long it
    lasted): a scrape every 15 s must not write a line every 15 s.
    """

    def __init__(
        self,
        redis: Any = None,
        *,
        prefix: str = "dq",
        queues: Iterable[str] | None = None,
        overdue_after: float = 1.0,
        timeout: float = 3.0,
    ) -> None:
        QueueKeys(prefix, "x")  # validates the prefix
        self.prefix = prefix
        self.queues = None if queues is None else [QueueKeys(prefix, n).name for n in queues]
        self._overdue_ms = duration_ms(overdue_after, "overdue_after")
        # A scrape rides out a short blip, then reports delayq_exporter_up 0.
        self._runner = runner.connect(redis, "delayq-exporter", timeout)
        self._outage_since: float | None = None  # monotonic time of the first failed scrape
        self._outage_lock = threading.Lock()  # scrapes may run on several server threads

    def close(self) -> None:
        """Close the Redis client if this collector created it."""
        self._runner.close()

    # -- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The queues a scrape reports: the given ones or the registry's valid names."""
        if self.queues is not None:
            return list(self.queues)
        raw = self._runner.command("SMEMBERS", QueueKeys(self.prefix, "x").registry)
        names = []
        for value in sorted(v.decode(errors="replace") if isinstance(v, bytes) else v for v in raw):
            try:
                names.append(QueueKeys(self.prefix, value).name)
            except ConfigError:
                log.debug("delayq exporter: skipping invalid queue name %r", value)
        return names

    def read(self) -> list[Stats]:
        """The stats of every reported queue, in one round trip per Redis node (raises
        :class:`RedisUnavailable` or :class:`ServerError`). A sharded queue's shards are read
        in the same round and summed, each shard in ``Stats.shards``."""
        names = self.names()
        if not names:
            return []
        raw = self._runner.command("HGETALL", sharding.shards_key(self.prefix))
        plan = sharding.StatsPlan(self.prefix, names, sharding.layouts_of(raw), self._overdue_ms)
        return plan.stats(self._runner.many(plan.calls))

    # -- prometheus -------------------------------------------------------------------------

    def snapshot(self) -> tuple[list[Stats], bool, float]:
        """One scrape's reading: the stats, whether Redis answered, and the seconds it took."""
        started = time.perf_counter()
        # During an outage already logged, the connection layer's own "call failed,
        # retrying" warning (one per call, so one per scrape) is dropped for this thread.
        muted = self._outage_since is not None
        if muted:
            _RETRY_NOISE.mute()
        try:
            rows, up = self.read(), True
        except (DelayqError, RedisError, OSError) as exc:
            self._failed(exc)
            rows, up = [], False
        else:
            self._recovered()
        finally:
            if muted:
                _RETRY_NOISE.unmute()
        return rows, up, time.perf_counter() - started

    def _failed(self, exc: BaseException) -> None:
        with self._outage_lock:
            if self._outage_since is not None:
                return  # logged at the outage's first scrape
            self._outage_since = time.monotonic()
        log.warning(
            "delayq exporter: cannot read queue stats from Redis (%s: %s); "
            "scrapes report delayq_exporter_up 0 until it answers",
            type(exc).__name__,
            printable(exc),
        )

    def _recovered(self) -> None:
        with self._outage_lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            log.info(
                "delayq exporter: Redis is available again (unavailable for %.1f s)",
                time.monotonic() - since,
            )

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() (and Redis) on registration.
        for name, kind, text in FAMILIES:
            yield Metric(name, text, kind)

    def collect(self) -> Iterator[Metric]:
        """The metrics as prometheus-client objects (when registered on a registry)."""
        for (name, kind, text), samples in zip(FAMILIES, grouped(*self.snapshot()), strict=True):
            family = Metric(name, text, kind)
            for sample, labels, value in samples:
                family.add_sample(sample, dict(labels), value)
            yield family

    def render(self) -> str:
        """The metrics in the Prometheus text format, written directly: one scrape of many
        queues is thousands of samples, and prometheus-client's generic exposition of them
        costs several times the Redis round (see bench/exporter.py)."""
        out: list[str] = []
        for (name, kind, text), samples in zip(FAMILIES, grouped(*self.snapshot()), strict=True):
            if kind == "counter":
                name += "_total"  # text format 0.0.4 names counters by their samples
            out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
            for sample, labels, value in samples:
                if labels:
                    pairs = ",".join(f'{k}="{v}"' for k, v in labels)
                    out.append(f"{sample}{{{pairs}}} {_number(value)}\n")
                else:
                    out.append(f"{sample} {_number(value)}\n")
        return "".join(out)


class _MutedThreads(logging.Filter):
    """Drops the records of the ``delayq`` logger (the connection layer's) emitted by the
    threads that muted it, and only while they do; other threads log as usual."""

    def __init__(self) -> None:
        super().__init__()
        self._muted: dict[int, int] = {}  # thread id -> nesting depth
        self._lock = threading.Lock()

    def mute(self) -> None:
        with self._lock:
            ident = threading.get_ident()
            self._muted[ident] = self._muted.get(ident, 0) + 1

    def unmute(self) -> None:
        with self._lock:
            ident = threading.get_ident()
            depth = self._muted.pop(ident, 1) - 1
            if depth:
                self._muted[ident] = depth

    def filter(self, record: logging.LogRecord) -> bool:
        return threading.get_ident() not in self._muted


_RETRY_NOISE = _MutedThreads()
logging.getLogger("delayq").addFilter(_RETRY_NOISE)  # a logger filter: its own records only


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
    ("delayq_exporter_up", "gauge", "1 if Redis answered this scrape, else 0."),
    (
        "delayq_exporter_scrape_duration_seconds",
        "gauge",
        "Time this scrape spent reading queue stats from Redis.",
    ),
)


def grouped(
    rows: Sequence[Stats], up: bool, seconds: float
) -> list[list[tuple[str, Labels, float]]]:
    """The samples of each family of :data:`FAMILIES` (same order): (name, labels, value)."""
    out: list[list[tuple[str, Labels, float]]] = [[] for _ in FAMILIES]
    tasks, overdue, oldest, next_due, seen, *counters, lateness, shard_tasks, up_, duration = out
    for stats in rows:
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
    up_.append(("delayq_exporter_up", (), 1 if up else 0))
    duration.append(("delayq_exporter_scrape_duration_seconds", (), seconds))
    return out


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
