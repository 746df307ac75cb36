"""Recurring schedules, the pure part (issue #19): the timing spec and its fire times, the
policies, and the values users read back (docs/schedules.md).

Cron times need time zones, which Lua lacks, so Python computes them (cronsim with stdlib
``zoneinfo``, which follows Debian cron across DST changes) as a pure function of the spec and
the previous fire's UTC instant: every process computes the same times whatever its clock,
and the scripts referee who writes them. Interval times need no zone: ``phase + k * every``
on the Unix epoch, which the scripts compute themselves.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..exceptions import ConfigError
from .timing import Duration, duration_ms

Overlap = Literal["skip", "buffer_one", "buffer_all", "allow_all"]
CatchUp = Literal["latest", "all", "skip"]
OVERLAPS: Final = get_args(Overlap)
CATCHUPS: Final = get_args(CatchUp)

# The scripts keep this many cron times ahead and ask for more (the fetch reply's trailing
# signal) when fewer than LOOKAHEAD_LOW remain; an interval schedule needs none.
LOOKAHEAD: Final = 32
LOOKAHEAD_LOW: Final = 8
# Backfill and catch-up="all" replay at most this many fires per call.
MAX_REPLAY: Final = 100
# A fire's nominal time goes into its envelope as this many digits (epoch ms until 2286).
FIRE_DIGITS: Final = 13
MAX_NAME_LEN: Final = 200
# The header fields of a fire's envelope that name its schedule and nominal time.
SCHEDULE_HEADER: Final = "delayq-schedule"
FIRE_HEADER: Final = "delayq-fire-ms"


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigError(f"tz must be an IANA zone name such as 'Europe/London', got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"unknown time zone {tz!r}") from exc


def _aware_ms(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ConfigError(f"{what} must be an aware datetime, got {value!r}")
    return round(value.timestamp() * 1000)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}")


def _exact_ms(value: object, what: str, *, allow_zero: bool = True) -> int:
    """A duration as the nearest whole ms: fire times are exact, so ``timedelta(
    milliseconds=4030)`` is 4030 (a delay rounds up, to be never early: 4.03 s would be 4031)."""
    try:
        duration_ms(value, what, allow_zero=allow_zero)  # the checks and their messages
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if isinstance(value, timedelta):
        return round(value / timedelta(milliseconds=1))
    return round(float(value) * 1000)  # type: ignore[arg-type]


def check_name(name: object) -> str:
    """A schedule name: 1-200 characters from A-Z a-z 0-9 _ . : -, as a queue's (it goes into
    key names, task ids and metric labels)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"invalid schedule name {name!r}: use 1-{MAX_NAME_LEN} characters from "
            "A-Z a-z 0-9 _ . : -, starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a schedule fires: ``cron=`` (5 fields, or 6 with seconds first) in ``tz``, or
    ``every=`` (seconds or a timedelta) aligned to ``phase`` after the Unix epoch, not counted
    from the last run; within ``[start, end]`` when given (aware datetimes).

    Cron follows Debian cron across DST changes (cronsim): a fixed time that does not exist
    fires at the jump, one in a repeated hour fires once, and hourly or faster expressions
    follow elapsed time.
    """

    cron: str | None = None
    every: Duration | None = field(default=None, compare=False)
    tz: str = "UTC"
    phase: Duration = field(default=0, compare=False)
    start: datetime | None = field(default=None, compare=False)
    end: datetime | None = field(default=None, compare=False)
    # The normalised values, which equality compares (60 and timedelta(minutes=1) are equal).
    every_ms: int = field(init=False, default=0, repr=False)
    phase_ms: int = field(init=False, default=0, repr=False)
    start_ms: int | None = field(init=False, default=None, repr=False)
    end_ms: int | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigError("a schedule takes exactly one of cron= and every=")
        zone = _zone(self.tz)
        if self.cron is not None:
            if not isinstance(self.cron, str) or len(self.cron.split()) not in (5, 6):
                raise ConfigError(f"cron must be 5 fields (or 6, seconds first), got {self.cron!r}")
            try:
                CronSim(self.cron, datetime.now(zone))
            except CronSimError as exc:
                raise ConfigError(f"invalid cron expression {self.cron!r}: {exc}") from exc
        else:
            every_ms = _exact_ms(self.every, "every", allow_zero=False)
            phase_ms = _exact_ms(self.phase, "phase")
            if phase_ms >= every_ms:
                raise ConfigError(f"phase must be shorter than every, got {self.phase!r}")
            object.__setattr__(self, "every_ms", every_ms)
            object.__setattr__(self, "phase_ms", phase_ms)
        start_ms, end_ms = _aware_ms(self.start, "start"), _aware_ms(self.end, "end")
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise ConfigError("end must not be before start")
        object.__setattr__(self, "start_ms", start_ms)
        object.__setattr__(self, "end_ms", end_ms)

    @property
    def kind(self) -> Literal["cron", "every"]:
        return "cron" if self.cron is not None else "every"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_fires(self, after: datetime, n: int = 1) -> list[datetime]:
        """The next ``n`` fire times strictly after ``after`` (aware), as aware datetimes in
        the schedule's zone; fewer if the schedule ends first."""
        after_ms = _aware_ms(after, "after")
        assert after_ms is not None
        zone = self.zone
        return [datetime.fromtimestamp(ms / 1000, zone) for ms in self.fires_after_ms(after_ms, n)]

    def fires_after_ms(self, after_ms: int, n: int) -> list[int]:
        """The next ``n`` fire times after epoch ms ``after_ms``, in epoch ms."""
        if self.start_ms is not None and after_ms < self.start_ms:
            after_ms = self.start_ms - 1
        times = (
            self._every_after(after_ms, n) if self.cron is None else self._cron_after(after_ms, n)
        )
        if self.end_ms is not None:
            times = [t for t in times if t <= self.end_ms]
        return times

    def fires_between_ms(self, first_ms: int, last_ms: int, limit: int) -> list[int]:
        """The fire times in ``[first_ms, last_ms]``, at most ``limit`` of them."""
        times: list[int] = []
        after = first_ms - 1
        while len(times) < limit:
            batch = self.fires_after_ms(after, LOOKAHEAD)
            if not batch:
                break
            for ms in batch:
                if ms > last_ms or len(times) >= limit:
                    return times
                times.append(ms)
            after = batch[-1]
        return times

    def _every_after(self, after_ms: int, n: int) -> list[int]:
        first = self.phase_ms + ((after_ms - self.phase_ms) // self.every_ms + 1) * self.every_ms
        return [first + k * self.every_ms for k in range(n)]

    def _cron_after(self, after_ms: int, n: int) -> list[int]:
        assert self.cron is not None
        # From the previous instant in the zone: stateless, so every process agrees. In the
        # second copy of a repeated hour cronsim can name a time of the first copy (before
        # ``after``): such times are dropped, which makes a repeated hour fire once.
        start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(self.zone)
        times: list[int] = []
        sim = CronSim(self.cron, start)
        for _ in range(n * 4 + 16):  # bounded: at most a few dropped times per copy
            try:
                moment = next(sim)
            except StopIteration:  # no match within 50 years
                break
            ms = round(moment.timestamp() * 1000)
            if ms > after_ms and (not times or ms > times[-1]):
                times.append(ms)
                if len(times) == n:
                    break
        return times

    def explain(self) -> str:
        """A plain-English description (cronsim's ``explain()`` for cron)."""
        if self.cron is not None:
            text = CronSim(self.cron, datetime.now(self.zone)).explain()
            return text if self.tz == "UTC" else f"{text} ({self.tz})"
        every = timedelta(milliseconds=self.every_ms)
        phase = timedelta(milliseconds=self.phase_ms)
        return f"Every {every}, aligned to the Unix epoch" + (f" + {phase}" if phase else "")

    def as_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data (stored with the schedule; see :func:`schedule_of`)."""
        return {
            "cron": self.cron,
            "every_ms": self.every_ms if self.cron is None else None,
            "phase_ms": self.phase_ms if self.cron is None else None,
            "tz": self.tz,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }


def schedule_of(data: dict[str, Any]) -> Schedule:
    """The :class:`Schedule` that :meth:`Schedule.as_dict` wrote."""

    def when(ms: int | None) -> datetime | None:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)

    every = data.get("every_ms")
    return Schedule(
        cron=data.get("cron"),
        every=None if every is None else timedelta(milliseconds=every),
        tz=data.get("tz", "UTC"),
        phase=timedelta(milliseconds=data.get("phase_ms") or 0),
        start=when(data.get("start_ms")),
        end=when(data.get("end_ms")),
    )


@dataclass(frozen=True, slots=True)
class SchedulePolicy:
    """What a schedule does besides firing on time (the upsert's keyword arguments)."""

    max_fires: int | None = None
    jitter_ms: int = 0
    overlap: Overlap = "skip"
    catchup: CatchUp = "latest"
    catchup_window_ms: int | None = None
    priority: int = 0

    @classmethod
    def of(
        cls,
        *,
        max_fires: object = None,
        jitter: object = None,
        overlap: object = "skip",
        catchup: object = "latest",
        catchup_window: object = None,
        priority: object = 0,
    ) -> SchedulePolicy:
        """Validated policy settings; a bad one is a :class:`ConfigError` naming it."""
        if max_fires is not None and (
            not isinstance(max_fires, int) or isinstance(max_fires, bool) or max_fires < 1
        ):
            raise ConfigError(f"max_fires must be an int >= 1 or None, got {max_fires!r}")
        if overlap not in OVERLAPS:
            raise ConfigError(f"overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
        if catchup not in CATCHUPS:
            raise ConfigError(f"catchup must be one of {', '.join(CATCHUPS)}, got {catchup!r}")
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9:
            raise ConfigError(f"priority must be an int from 0 to 9, got {priority!r}")
        try:
            jitter_ms = 0 if jitter is None else duration_ms(jitter, "jitter")
            window_ms = (
                None
                if catchup_window is None
                else duration_ms(catchup_window, "catchup_window", allow_zero=False)
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return cls(max_fires, jitter_ms, overlap, catchup, window_ms, priority)  # type: ignore[arg-type]


def spec_hash(schedule: Schedule, policy: SchedulePolicy, template: bytes) -> str:
    """A digest of everything that defines a schedule: the same spec upserted again (50 pods
    at boot) is recognised and left alone."""
    doc = json.dumps([schedule.as_dict(), _policy_dict(policy)], sort_keys=True).encode()
    return hashlib.sha1(doc + b"\0" + template).hexdigest()[:16]


def _policy_dict(policy: SchedulePolicy) -> dict[str, Any]:
    return {
        "max_fires": policy.max_fires,
        "jitter_ms": policy.jitter_ms,
        "overlap": policy.overlap,
        "catchup": policy.catchup,
        "catchup_window_ms": policy.catchup_window_ms,
        "priority": policy.priority,
    }


def spec_json(schedule: Schedule, policy: SchedulePolicy) -> str:
    """The spec as Python reads it back (``ScheduleInfo``)."""
    return json.dumps({"schedule": schedule.as_dict(), "policy": _policy_dict(policy)})


def spec_from_json(text: str) -> tuple[Schedule, SchedulePolicy]:
    doc = json.loads(text)
    return schedule_of(doc["schedule"]), SchedulePolicy(**doc["policy"])


def fire_placeholder(seed: str) -> str:
    """A FIRE_DIGITS-long marker that the scripts replace with each fire's nominal ms (the
    same length, so a msgpack envelope's string header stays valid)."""
    return "~" + hashlib.sha1(seed.encode()).hexdigest()[: FIRE_DIGITS - 1]


def fire_time_of(headers: dict[str, str]) -> datetime | None:
    """A fire's nominal time from its envelope headers (None for a task of no schedule)."""
    raw = headers.get(FIRE_HEADER)
    if raw is None or not raw.isdigit():
        return None
    return datetime.fromtimestamp(int(raw) / 1000, UTC)


def to_dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as Redis holds it, from ``q.schedules.get/list/upsert``.

    ``fired`` counts fires offered by the chain, ``skipped`` those dropped by the overlap
    policy, ``missed`` those dropped by the catch-up policy or window; ``manual`` and
    ``backfilled`` count ``trigger()`` and ``backfill()`` fires. ``last_outcome`` is how the
    latest finished fire ended: ``ok`` (acked), ``dead``, ``cancelled``, ``expired``,
    ``skipped`` or ``missed``.

    ``payload`` is decoded with the reading queue's codec; when it cannot be (a pickled
    payload read by a queue without ``codec="pickle"``, a payload type that does not match),
    it is None and ``payload_error`` says why. ``tzdata`` is the time zone database release
    the cron times ahead were last computed with, read from ``tzdata_source`` (a directory of
    ``zoneinfo.TZPATH`` or the tzdata package); None for interval schedules.
    """

    name: str
    schedule: Schedule
    payload: Any
    max_fires: int | None
    jitter: float
    overlap: Overlap
    catchup: CatchUp
    catchup_window: float | None
    priority: int
    version: int
    next_fire: datetime | None
    next_fires: list[datetime]
    last_fire: datetime | None
    last_success: datetime | None
    last_outcome: str | None
    fired: int
    skipped: int
    missed: int
    manual: int
    backfilled: int
    running: int
    paused: bool
    note: str | None
    done: bool
    changed: bool | None = None  # upsert only: the spec differed (None on get/list)
    payload_error: str | None = None
    tzdata: str | None = None
    tzdata_source: str | None = None
