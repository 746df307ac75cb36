"""The recurring-schedule metrics of the exporter (issue #19): read at scrape time with one
``schedule_info`` call per (sub-)queue, in the same kind of round as the stats (one round
trip per Redis node), and turned into samples without decoding any payload."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.keys import QueueKeys
from .._core.models import Stats
from .._core.schedule import spec_from_json
from .._core.schedule_calls import StoredSchedule, parse_info
from .._core.scripts import Op

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, float]

# (name, type, help) of the schedule families, appended to the collector's FAMILIES.
SCHEDULE_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        "delayq_schedule_fires",
        "counter",
        "Fires of a recurring schedule by outcome: fired (offered by the chain), skipped "
        "(overlap policy), missed (catch-up policy or window), manual (trigger), backfilled.",
    ),
    (
        "delayq_schedule_next_fire_timestamp_seconds",
        "gauge",
        "Unix time of a schedule's next nominal fire (absent when paused or done).",
    ),
    (
        "delayq_schedule_last_success_timestamp_seconds",
        "gauge",
        "Unix time a fire of the schedule was last acked (absent when never).",
    ),
    (
        "delayq_schedule_period_seconds",
        "gauge",
        "Seconds between a schedule's next two fires (for alerts: a stuck chain, no success "
        "in N periods).",
    ),
    ("delayq_schedule_paused", "gauge", "1 if the schedule is paused, else 0."),
)
OUTCOMES = ("fired", "skipped", "missed", "manual", "backfilled")


def parts_of(row: Stats) -> list[str]:
    """The (sub-)queue names holding a queue's schedules."""
    return [shard.queue for shard in row.shards] or [row.queue]


def calls(prefix: str, rows: Sequence[Stats]) -> list[tuple[Any, tuple[str, ...], list[Any]]]:
    return [
        (Op.SCHEDULE_INFO, QueueKeys(prefix, part).all, [2])
        for row in rows
        for part in parts_of(row)
    ]


def _int(stored: StoredSchedule, field: str) -> int:
    value = stored.state.get(field)
    return int(value) if value not in (None, b"", "") else 0


def next_two(stored: StoredSchedule) -> list[int]:
    schedule, _ = spec_from_json(stored.state["spec"].decode())
    if schedule.cron is not None:
        return stored.ahead[:2]
    return schedule.fires_after_ms(_int(stored, "cursor"), 2)


def samples(rows: Sequence[Stats], replies: Sequence[Any]) -> list[list[Sample]]:
    """The samples of each family of :data:`SCHEDULE_FAMILIES` (same order)."""
    out: list[list[Sample]] = [[] for _ in SCHEDULE_FAMILIES]
    fires, next_fire, last_ok, period, paused = out
    left = iter(replies)
    for row in rows:
        for _ in parts_of(row):
            reply = next(left, None)  # none: a reading without schedule replies
            if reply is None or isinstance(reply, Exception):  # the stats still report
                continue
            for stored in parse_info(reply)[1]:
                q = (("queue", row.queue), ("schedule", stored.name))
                for outcome in OUTCOMES:
                    value = _int(stored, outcome)
                    fires.append(("delayq_schedule_fires_total", (*q, ("outcome", outcome)), value))
                is_paused, done = _int(stored, "paused") == 1, _int(stored, "done") == 1
                paused.append(("delayq_schedule_paused", q, 1 if is_paused else 0))
                upcoming = next_two(stored)
                if upcoming and not (is_paused or done):
                    next_fire.append(
                        ("delayq_schedule_next_fire_timestamp_seconds", q, upcoming[0] / 1000)
                    )
                if len(upcoming) == 2:
                    gap = (upcoming[1] - upcoming[0]) / 1000
                    period.append(("delayq_schedule_period_seconds", q, gap))
                if _int(stored, "last_ok"):
                    ok_s = _int(stored, "last_ok") / 1000
                    last_ok.append(("delayq_schedule_last_success_timestamp_seconds", q, ok_s))
    return out
