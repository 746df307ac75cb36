"""In-memory history of the queues for the charts: samples, per-bin deltas, quantiles, health.

Pure code (no Redis, no clock of its own). The sampler adds one :class:`Sample` per queue
every few seconds; a bounded ring buffer keeps the last hour. Counters are lifetime totals in
Redis, so throughput and lateness per bin are deltas between consecutive samples; a counter
that went down (keys deleted) restarts from zero instead of making a negative rate.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .. import Stats

CONSUMER_GRACE_S = 30.0  # overdue with no consumer (or no delivery) for this long = stuck


@dataclass(frozen=True, slots=True)
class Sample:
    """What the charts need from one ``stats()`` reading, taken at ``t`` (epoch seconds)."""

    t: float
    delivered: int
    acked: int
    lateness: Mapping[float, int]  # bucket upper bound s -> lifetime count (non-cumulative)


def sample_of(stats: Stats, t: float) -> Sample:
    """The :class:`Sample` of a stats reading."""
    counters = stats.counters
    return Sample(
        t, int(counters.get("delivered", 0)), int(counters.get("acked", 0)), dict(stats.lateness)
    )


@dataclass(slots=True)
class Bin:
    """Deltas that ended within one time bin; ``covered_s`` is the time those deltas span."""

    start: float
    covered_s: float = 0.0
    delivered: int = 0
    acked: int = 0
    lateness: dict[float, int] = field(default_factory=dict)

    def add(self, other: Bin) -> None:
        self.covered_s = max(self.covered_s, other.covered_s)
        self.delivered += other.delivered
        self.acked += other.acked
        for bound, count in other.lateness.items():
            self.lateness[bound] = self.lateness.get(bound, 0) + count

    def per_minute(self, count: int) -> float | None:
        """``count`` as a rate per minute over the covered time; None without data."""
        return None if self.covered_s <= 0 else count * 60.0 / self.covered_s

    def quantile_ms(self, q: float) -> float | None:
        value = quantile(q, self.lateness)
        return None if value is None else value * 1000


def _delta(new: int, old: int) -> int:
    return new - old if new >= old else new  # a reset counter counts from zero


def quantile(q: float, buckets: Mapping[float, int]) -> float | None:
    """The ``q`` quantile of a histogram of non-cumulative bucket counts keyed by upper bound,
    interpolated linearly inside its bucket (as Prometheus does); None if it is empty. Values
    in the open last bucket (bound ``inf``) are reported as the last finite bound."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    rank, seen, lower = q * total, 0, 0.0
    for bound in sorted(buckets):
        count = buckets[bound]
        if count > 0 and seen + count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * max(rank - seen, 0) / count
        seen += count
        if not math.isinf(bound):
            lower = bound
    return lower


class History:
    """The last ``window_s`` seconds of samples, in memory only: a total over every queue,
    and one series per tracked queue.

    At most ``max_queues`` queues are tracked. The sampler's :meth:`record` forgets queues
    that left the registry; when every slot is taken, a queue whose counters moved takes the
    slot of the tracked queue that has been idle the longest, if that one has been idle for
    ``evict_idle_s`` at least (so that charts of busy queues are not traded back and forth
    when more queues are busy than there are slots). The total covers every queue."""

    def __init__(
        self,
        window_s: float = 3600.0,
        interval_s: float = 5.0,
        max_queues: int = 200,
        evict_idle_s: float = 300.0,
    ) -> None:
        self.window_s = window_s
        self.max_queues, self.evict_idle_s = max_queues, evict_idle_s
        self._maxlen = math.ceil(window_s / interval_s) + 2
        self._series: dict[str, deque[Sample]] = {}
        self._active: dict[str, float] = {}  # tracked queue -> when its counters last moved
        self._last: dict[str, Sample] = {}  # every queue's latest sample (for the total)
        self._total: deque[Sample] = deque(maxlen=self._maxlen)

    def add(self, queue: str, sample: Sample) -> None:
        """Append ``sample`` to the series of ``queue`` (tracked from now on)."""
        series = self._series.get(queue)
        if series is None:
            series = self._series[queue] = deque(maxlen=self._maxlen)
            self._active[queue] = sample.t
        elif series:
            last = series[-1]
            if (last.delivered, last.acked) != (sample.delivered, sample.acked):
                self._active[queue] = sample.t
            if last.lateness == sample.lateness:  # share it: most samples repeat the last one
                sample = Sample(sample.t, sample.delivered, sample.acked, last.lateness)
        series.append(sample)
        while series and series[0].t < sample.t - self.window_s - 1:
            series.popleft()

    def record(self, samples: Mapping[str, Sample], t: float) -> None:
        """One sampler round: ``samples`` holds every registered queue's sample, taken at
        ``t``. Updates the total, the tracked series, and forgets queues not in ``samples``."""
        self._add_total(samples, t)
        self.keep_only(samples)
        evictable: list[str] | None = None  # idlest last; worked out once per round
        for name, sample in samples.items():
            if name not in self._series and len(self._series) >= self.max_queues:
                if not self._moved(name, sample):
                    continue
                if evictable is None:
                    idle = [n for n, a in self._active.items() if t - a >= self.evict_idle_s]
                    evictable = sorted(idle, key=lambda n: (self._active[n], n), reverse=True)
                if not evictable:
                    continue
                self._forget(evictable.pop())
            self.add(name, sample)
        self._last = dict(samples)

    def _moved(self, name: str, sample: Sample) -> bool:
        before = self._last.get(name)
        return before is not None and (before.delivered, before.acked) != (
            sample.delivered,
            sample.acked,
        )

    def _add_total(self, samples: Mapping[str, Sample], t: float) -> None:
        previous = self._total[-1] if self._total else Sample(t, 0, 0, {})
        delivered, acked = previous.delivered, previous.acked
        lateness = dict(previous.lateness)
        for name, new in samples.items():
            old = self._last.get(name)
            if old is None:  # first sight: its lifetime counters are not this round's work
                continue
            delivered += _delta(new.delivered, old.delivered)
            acked += _delta(new.acked, old.acked)
            for bound, value in new.lateness.items():
                d = _delta(value, old.lateness.get(bound, 0))
                if d:
                    lateness[bound] = lateness.get(bound, 0) + d
        shared = previous.lateness if lateness == previous.lateness else lateness
        self._total.append(Sample(t, delivered, acked, shared))
        while self._total and self._total[0].t < t - self.window_s - 1:
            self._total.popleft()

    def _forget(self, queue: str) -> None:
        self._series.pop(queue, None)
        self._active.pop(queue, None)

    def keep_only(self, queues: Iterable[str]) -> None:
        """Forget queues that are no longer registered."""
        wanted = set(queues)
        for name in [n for n in self._series if n not in wanted]:
            self._forget(name)

    def samples(self, queue: str) -> list[Sample]:
        return list(self._series.get(queue, ()))

    def tracked(self, queue: str) -> bool:
        return queue in self._series

    @property
    def queues(self) -> list[str]:
        return sorted(self._series)

    def since(self, queue: str | None = None) -> float | None:
        """When the oldest sample kept (of ``queue``, or of the total) was taken."""
        series = self._total if queue is None else self._series.get(queue)
        if series:
            return series[0].t
        if queue is None and self._series:  # filled by add() alone (no sampler rounds)
            return min(s[0].t for s in self._series.values() if s)
        return None

    def bins(self, queue: str, now: float, bin_s: float = 60.0) -> list[Bin]:
        """Deltas of ``queue`` per ``bin_s`` over the window ending at ``now``, oldest first."""
        return bins_of(self.samples(queue), now, self.window_s, bin_s)

    def total_bins(self, now: float, bin_s: float = 60.0) -> list[Bin]:
        """The bins of every queue added up (one series: the page costs the same however
        many queues there are)."""
        if self._total or not self._series:
            return bins_of(list(self._total), now, self.window_s, bin_s)
        total = [Bin(b.start) for b in bins_of([], now, self.window_s, bin_s)]
        for name in self._series:  # history filled by add() alone
            for acc, b in zip(total, self.bins(name, now, bin_s), strict=True):
                acc.add(b)
        return total

    def delivered_since(self, queue: str, seconds: float) -> int | None:
        """Deliveries in about the last ``seconds``, or None if the history is shorter."""
        series = self._series.get(queue)
        if not series or series[-1].t - series[0].t < seconds:
            return None
        last = series[-1]
        for s in reversed(series):
            if last.t - s.t >= seconds:
                return _delta(last.delivered, s.delivered)
        return None


def bins_of(samples: Sequence[Sample], now: float, window_s: float, bin_s: float) -> list[Bin]:
    count = max(1, round(window_s / bin_s))
    start = now - count * bin_s
    bins = [Bin(start + i * bin_s) for i in range(count)]
    for old, new in itertools.pairwise(samples):
        i = math.floor((new.t - start) / bin_s)
        if not 0 <= i < count or new.t <= old.t:
            continue
        b = bins[i]
        b.covered_s += new.t - old.t
        b.delivered += _delta(new.delivered, old.delivered)
        b.acked += _delta(new.acked, old.acked)
        for bound, value in new.lateness.items():
            d = _delta(value, old.lateness.get(bound, 0))
            if d:
                b.lateness[bound] = b.lateness.get(bound, 0) + d
    return bins


def health(
    stats: Stats, server_now: datetime, history: History, grace_s: float = CONSUMER_GRACE_S
) -> str:
    """``ok``; ``dead`` (dead-lettered tasks wait for someone to look at them); ``late``
    (overdue tasks, consumers at work); or ``stuck``: overdue tasks or expired leases and no
    consumer fetched for ``grace_s``, or overdue tasks and none was delivered during the last
    ``grace_s``. The worst one wins. (An expired lease while consumers fetch is reclaimed by
    their next fetch: no flag.) A paused queue is ``paused`` (it hands out nothing on purpose)
    unless it has dead tasks."""
    if stats.paused:  # [L]
        return "dead" if stats.dead > 0 else "paused"
    seen = stats.consumer_seen_at
    gone = seen is None or (server_now - seen).total_seconds() > grace_s
    if stats.expired > 0 and gone:
        return "stuck"
    if stats.overdue <= 0:
        return "dead" if stats.dead > 0 else "ok"
    if gone:
        return "stuck"
    if history.delivered_since(stats.queue, grace_s) == 0:
        return "stuck"
    return "late"


# Main-page order: the queues that need someone first.
HEALTH_RANK = {"stuck": 0, "late": 1, "dead": 2, "paused": 3, "ok": 4}
