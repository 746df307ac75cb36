"""The schedule scripts' arguments and replies (schedule_*.lua), pure: no Redis, no asyncio."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple, TypedDict

from ..exceptions import ConfigError, DecodeError
from .envelope import EnvelopeCodec
from .protocol import check_headers, check_id
from .schedule import (
    FIRE_HEADER,
    LOOKAHEAD,
    MAX_REPLAY,
    SCHEDULE_HEADER,
    Schedule,
    ScheduleInfo,
    SchedulePolicy,
    fire_placeholder,
    spec_from_json,
    spec_hash,
    spec_json,
    to_dt,
)
from .tzsource import TzSource, tz_source

# How long a removed schedule's tombstone (cursor, version) stays, and a trigger or backfill
# request is remembered (a retry of it does nothing again).
TOMBSTONE_MS: Final = 7 * 24 * 3600 * 1000
REQUEST_MS: Final = 24 * 3600 * 1000


# The offer options a schedule's fires take; the rest (id, key, due time, ttl) belong to one
# task, not to a series.
class FireOptions(TypedDict, total=False):
    """The offer options of a schedule's fires (the rest, such as ``id``, ``key`` or ``ttl``,
    belong to one task, not to a series)."""

    priority: int
    headers: Mapping[str, str]


FIRE_OPTIONS: Final = FireOptions.__optional_keys__


def template(
    codec: EnvelopeCodec, name: str, payload: Any, headers: Mapping[str, str], priority: int
) -> bytes:
    """The envelope every fire of schedule ``name`` starts from: the payload, the headers that
    name the schedule and, as a placeholder the scripts overwrite, the nominal time."""
    marked = {**headers, SCHEDULE_HEADER: name, FIRE_HEADER: fire_placeholder(name)}
    return codec.encode(payload, headers=marked, priority=priority)


def check_fire_options(options: Mapping[str, Any]) -> tuple[dict[str, str], int]:
    """The headers and priority of a schedule's fires, from upsert's offer options."""
    unknown = sorted(set(options) - FIRE_OPTIONS)
    if unknown:
        raise ConfigError(
            f"schedules take the offer options {', '.join(sorted(FIRE_OPTIONS))}, "
            f"not {', '.join(unknown)} (each fire is its own task with its own id and time)"
        )
    headers = check_headers(options.get("headers"))
    reserved = {SCHEDULE_HEADER, FIRE_HEADER} & set(headers)
    if reserved:
        raise ConfigError(f"header {sorted(reserved)[0]!r} is set by delayq on a schedule's fires")
    priority = options.get("priority", 0)
    return headers, SchedulePolicy.of(priority=priority).priority


def upsert_args(
    name: str, schedule: Schedule, policy: SchedulePolicy, envelope: bytes
) -> list[Any]:
    return [
        name,
        spec_hash(schedule, policy, envelope),
        spec_json(schedule, policy),
        schedule.kind,
        schedule.every_ms,
        schedule.phase_ms,
        schedule.start_ms or 0,
        schedule.end_ms or 0,
        policy.max_fires or 0,
        policy.jitter_ms,
        policy.overlap,
        policy.catchup,
        policy.catchup_window_ms or 0,
        policy.priority,
        envelope,
        fire_placeholder(name),
    ]


class Upserted(NamedTuple):
    status: int  # 0 the same spec was there, 1 created, 2 changed
    version: int
    cursor_ms: int
    ahead: int  # cron times ahead


def parse_upsert(reply: Sequence[Any]) -> Upserted:
    return Upserted(*(int(v) for v in reply))


def refill_args(
    name: str, version: int, schedule: Schedule, after_ms: int, count: int = LOOKAHEAD
) -> list[Any]:
    """The refill call for a cron schedule: ``count`` times after ``after_ms`` (the later of
    its cursor and its last time ahead), whether the spec has no more, and the time zone
    database they were computed with."""
    times = schedule.fires_after_ms(after_ms, count)
    return [name, version, 1 if len(times) < count else 0, tz_text(tz_source(schedule.tz)),
            *times]  # fmt: skip


def tz_text(source: TzSource) -> str:
    """A time zone database as a schedule's state records it (``tzv``)."""
    return f"{source.version}|{source.source}"


def tz_of(text: object) -> TzSource | None:
    """The time zone database a schedule's state records (None: none recorded)."""
    raw = _text(text) if text not in (None, b"", "") else ""
    version, bar, source = raw.partition("|")
    return TzSource(version, source) if bar and version else None


class Refilled(NamedTuple):
    added: int  # -1: refused (another version, or the schedule is gone)
    version: int
    previous_tz: TzSource | None  # the database the times ahead were computed with before


def parse_refill(reply: Sequence[Any]) -> Refilled:
    return Refilled(int(reply[0]), int(reply[1]), tz_of(reply[2] if len(reply) > 2 else None))


def tz_mismatch(name: str, previous: TzSource | None, mine: TzSource) -> str | None:
    """What to log when this process added cron times to schedule ``name`` whose times
    ahead were computed with another tzdata release (None: the same, or none recorded)."""
    if previous is None or previous.version == mine.version:
        return None
    return (
        f"schedule {name!r}: its cron times ahead were computed with tzdata "
        f"{previous.version} ({previous.source}), this process adds times computed with "
        f"{mine.version} ({mine.source}); processes with different time zone rules compute "
        f"different local times once a zone's rules change: run one tzdata release"
    )


def backfill_times(schedule: Schedule, start: datetime, end: datetime) -> list[int]:
    """The nominal times in ``[start, end]`` (aware), at most MAX_REPLAY."""
    for value, what in ((start, "start"), (end, "end")):
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise ConfigError(f"backfill {what} must be an aware datetime, got {value!r}")
    if end < start:
        raise ConfigError("backfill end must not be before start")
    first, last = round(start.timestamp() * 1000), round(end.timestamp() * 1000)
    times = schedule.fires_between_ms(first, last, MAX_REPLAY + 1)
    if len(times) > MAX_REPLAY:
        raise ConfigError(
            f"backfill of more than {MAX_REPLAY} fires at once; split the range "
            f"({start.isoformat()} .. {end.isoformat()})"
        )
    return times


def request_id(value: object) -> str:
    """A trigger/backfill request id: one the caller gives repeats as a no-op."""
    return check_id(value, "request id")


class StoredSchedule(NamedTuple):
    name: str
    state: dict[str, Any]  # text fields as redis-py returns them (bytes), the template too
    ahead: list[int]


def parse_info(reply: Sequence[Any]) -> tuple[int, list[StoredSchedule]]:
    """The server's now (ms) and each schedule's state and cron times ahead."""
    found = []
    for i in range(1, len(reply), 3):
        flat = reply[i + 1]
        state = {_text(flat[k]): _raw(flat[k + 1]) for k in range(0, len(flat), 2)}
        found.append(StoredSchedule(_text(reply[i]), state, [int(t) for t in reply[i + 2]]))
    return int(reply[0]), found


def moved_to(stored: StoredSchedule) -> str | None:
    """The (sub-)queue a reshard moved a schedule to, when schedule_info found its tombstone
    (the reader's layout is out of date); None for a live schedule."""
    if "spec" in stored.state or "mv" not in stored.state:
        return None
    return _text(stored.state["mv"])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raw(value: Any) -> Any:
    # The template stays bytes (it may be msgpack); every other field is text.
    return value


def _int(state: Mapping[str, Any], field: str) -> int:
    value = state.get(field)
    return int(value) if value not in (None, b"", "") else 0


def _str(state: Mapping[str, Any], field: str) -> str:
    value = state.get(field)
    return "" if value is None else _text(value)


def info_of(
    stored: StoredSchedule, codec: EnvelopeCodec, now_ms: int, count: int = 5
) -> ScheduleInfo:
    """A :class:`ScheduleInfo` from what schedule_info.lua returned."""
    state = stored.state
    schedule, policy = spec_from_json(_str(state, "spec"))
    payload, payload_error = decoded_payload(codec, state.get("tpl"))
    tz = tz_of(state.get("tzv")) if schedule.cron is not None else None
    paused, done = _int(state, "paused") == 1, _int(state, "done") == 1
    cursor = _int(state, "cursor")
    if paused or done:
        upcoming: list[int] = []
    elif schedule.cron is None:
        upcoming = schedule.fires_after_ms(cursor, count)
    else:
        upcoming = stored.ahead[:count]
    if policy.max_fires is not None:
        upcoming = upcoming[: max(0, policy.max_fires - _int(state, "fired"))]
    zone = schedule.zone
    fires = [datetime.fromtimestamp(ms / 1000, zone) for ms in upcoming]
    last_ms = _int(state, "last_ms")
    return ScheduleInfo(
        name=stored.name,
        schedule=schedule,
        payload=payload,
        max_fires=policy.max_fires,
        jitter=policy.jitter_ms / 1000,
        overlap=policy.overlap,
        catchup=policy.catchup,
        catchup_window=(
            None if policy.catchup_window_ms is None else policy.catchup_window_ms / 1000
        ),
        priority=policy.priority,
        version=_int(state, "ver"),
        next_fire=fires[0] if fires else None,
        next_fires=fires,
        last_fire=datetime.fromtimestamp(last_ms / 1000, zone) if last_ms else None,
        last_success=to_dt(_int(state, "last_ok") or None),
        last_outcome=_str(state, "last_out") or None,
        fired=_int(state, "fired"),
        skipped=_int(state, "skipped"),
        missed=_int(state, "missed"),
        manual=_int(state, "manual"),
        backfilled=_int(state, "backfilled"),
        running=_int(state, "live"),
        paused=paused,
        note=_str(state, "note") or None,
        done=done,
        payload_error=payload_error,
        tzdata=tz.version if tz else None,
        tzdata_source=tz.source if tz else None,
    )


def decoded_payload(codec: EnvelopeCodec, template: object) -> tuple[Any, str | None]:
    """A schedule's payload as ``codec`` reads its template, or (None, why not): a payload
    the reader cannot decode is shown as invalid, never raised."""
    if not isinstance(template, bytes | str) or not template:
        return None, "no payload stored"
    raw = template.encode() if isinstance(template, str) else template
    try:
        return codec.decode(raw).payload, None
    except DecodeError as exc:
        return None, str(exc)
