"""Values returned to users: task info, stats, states and the retry policy."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from ..exceptions import ConfigError


def to_datetime(ms: int | None) -> datetime | None:
    """Epoch milliseconds (server clock) as an aware UTC datetime; a stored value outside
    years 1-9999 (which delayq never writes) as the nearest end, so that a reader shows it
    instead of crashing on it."""
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return (datetime.max if ms > 0 else datetime.min).replace(tzinfo=UTC)


class TaskState(StrEnum):
    """Where a task is in its life."""

    DELAYED = "delayed"  # waiting for its due time
    READY = "ready"  # due, waiting for a consumer
    INFLIGHT = "inflight"  # leased to a consumer
    EXPIRED = "expired"  # its lease ran out, no consumer has reclaimed it yet
    DEAD = "dead"  # dead-lettered
    # Ended: known only while its history lasts, on a queue that keeps task histories.
    DONE = "done"  # acked (or taken, at-most-once)
    CANCELLED = "cancelled"  # cancelled, dropped by its ttl or purged: it never ran to the end


# The states a queue holds tasks in: what tasks(), purge() and the views list.
HELD_STATES = tuple(s for s in TaskState if s not in (TaskState.DONE, TaskState.CANCELLED))


class DedupMode(StrEnum):
    """What ``offer(key=...)`` does when a live task already holds the key."""

    KEEP = "keep"  # leave the existing task; return its id
    REPLACE = "replace"  # debounce: update the pending task's payload and due time


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential retry backoff with jitter: ``min(max, base * 2**(attempt-1))``, of which up
    to ``jitter`` (a fraction) is randomly taken off so that retries spread out."""

    base: float = 1.0
    max: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        finite = all(math.isfinite(v) for v in (self.base, self.max, self.jitter))
        if not finite or not (0 < self.base <= self.max <= 86400 * 365) or not 0 <= self.jitter < 1:
            raise ConfigError(
                f"invalid backoff {self!r}: need 0 < base <= max <= a year, 0 <= jitter < 1"
            )

    def args(self) -> tuple[int, int, str]:
        """Script arguments: base ms, cap ms, and this call's jitter draw as a factor."""
        factor = 1 - self.jitter * random.random()
        return round(self.base * 1000), round(self.max * 1000), f"{factor:.6f}"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """A queue's lease and retry settings, read-only (``queue.policy``). A worker that wants
    others takes a view with them (``queue.with_policy(...)``), leaving the queue as it was."""

    visibility_timeout: float | None  # seconds a delivery is leased; None: at-most-once
    max_attempts: int
    retry_backoff: Backoff
    safety_interval: float  # seconds between looks at Redis when no news came

    @property
    def at_most_once(self) -> bool:
        """Tasks leave the queue when handed out: no lease, no ack, no retry."""
        return self.visibility_timeout is None


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A snapshot of one task, from :meth:`DelayQueue.get`."""

    id: str
    state: TaskState
    payload: Any
    attempts: int
    priority: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None
    due_at: datetime | None = None  # delayed / ready
    lease_expires_at: datetime | None = None  # inflight
    dead_at: datetime | None = None  # dead
    expires_at: datetime | None = None  # ttl deadline, if any
    last_error: str | None = None
    ended_at: datetime | None = None  # done / cancelled
    # done / cancelled: how, the history's last event (acked; delivered, at-most-once;
    # cancelled; expired, by its ttl; purged)
    outcome: str | None = None


@dataclass(frozen=True, slots=True)
class DeadTask:
    """A dead-lettered task, from :meth:`DelayQueue.dead`."""

    id: str
    payload: Any
    attempts: int
    dead_at: datetime
    error: str | None


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts per state (read in one atomic step) and lifetime counters of a queue."""

    queue: str
    delayed: int  # not due yet
    ready: int  # due, not yet handed out
    inflight: int  # leased to consumers, lease still running
    dead: int
    overdue: int  # ready for longer than the queue's overdue_after
    oldest_overdue_age: float  # seconds the oldest due task has waited; 0.0 if none
    next_due_at: datetime | None
    counters: Mapping[str, int] = field(default_factory=dict)
    # Delivery lateness (server hand-out time - due time) of every delivery so far: bucket
    # upper bound in seconds (the last is math.inf) -> deliveries in that bucket alone.
    lateness: Mapping[float, int] = field(default_factory=dict)
    lateness_sum: float = 0.0  # seconds, over all deliveries
    consumer_seen_at: datetime | None = None  # when a consumer last fetched
    shards: tuple[Stats, ...] = ()  # a sharded queue's sub-queues, in shard order
    # Leases that ran out with no consumer back to reclaim them (a fetch does, delivering the
    # task again): many, or any for long, means the consumers are gone or stuck.
    expired: int = 0
    paused: bool = False  # q.pause(): nothing is handed out until q.resume() or paused_until
    paused_until: datetime | None = None  # a timed pause's end; None: until resumed
    # Limits: tasks parked per limit key and leases held per key, for the 10 keys with the
    # most ("" = the queue's total); q.limits.list() has every key.
    limit_waiting: Mapping[str, int] = field(default_factory=dict)
    limit_running: Mapping[str, int] = field(default_factory=dict)
    # Tasks held back per reason ("rate", "concurrency", "ratelimited") for the 10 keys held
    # back most (each reason's total is counters["throttled:<reason>"]).
    limit_throttled: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Tasks stored in any state."""
        return self.delayed + self.ready + self.inflight + self.expired + self.dead
