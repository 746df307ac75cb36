"""Validation of delays, due times and durations (everything becomes integer milliseconds),
and durations as people type and read them."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Final

from ..exceptions import ConfigError, InvalidDelay

MAX_DELAY_MS: Final = 100 * 365 * 24 * 3600 * 1000  # beyond a century is a unit mistake
_EPOCH_MS_LIMIT: Final = 253402300799000  # 9999-12-31T23:59:59Z

_MAX_DELAY_S: Final = MAX_DELAY_MS // 1000

Duration = float | int | timedelta


def duration_ms(value: object, what: str = "delay", *, allow_zero: bool = True) -> int:
    """Seconds (int/float) or a timedelta as whole milliseconds, rounded up."""
    if type(value) is int and 0 <= value <= _MAX_DELAY_S and (value or allow_zero):
        return value * 1000  # the common cases, checked without the general path's work
    if type(value) is float and 0.0 < value <= _MAX_DELAY_S:  # NaN fails the comparison
        return math.ceil(value * 1000)
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf if value > 0 else -math.inf
    else:
        raise InvalidDelay(f"{what} must be seconds (int or float) or a timedelta, not {value!r}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidDelay(f"{what} must be finite, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidDelay(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    if seconds > MAX_DELAY_MS / 1000:
        raise InvalidDelay(f"{what} of {value!r} is more than a century; check the unit (seconds)")
    ms = math.ceil(seconds * 1000)
    if ms > MAX_DELAY_MS:
        raise InvalidDelay(f"{what} of {value!r} is more than a century; check the unit (seconds)")
    return ms


def setting_s(value: object, what: str, *, allow_zero: bool = True) -> float:
    """A duration option (seconds or a timedelta, as :func:`duration_ms` takes it) as
    seconds; a bad one is a :class:`ConfigError` naming the option ``what``."""
    try:
        return duration_ms(value, what, allow_zero=allow_zero) / 1000
    except InvalidDelay as exc:
        raise ConfigError(str(exc)) from exc


def epoch_ms(at: object) -> int:
    """An aware datetime or epoch seconds as epoch milliseconds."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidDelay("at must be a timezone-aware datetime (naive times are ambiguous)")
        ms = math.ceil(at.timestamp() * 1000)
    elif isinstance(at, int | float) and not isinstance(at, bool):
        if isinstance(at, float) and (math.isnan(at) or math.isinf(at)):
            raise InvalidDelay(f"at must be finite, got {at!r}")
        if not 0 <= at <= _EPOCH_MS_LIMIT / 1000:
            raise InvalidDelay(f"at={at!r} is outside years 1970-9999")
        ms = math.ceil(at * 1000)
    else:
        raise InvalidDelay(f"at must be an aware datetime or epoch seconds, not {at!r}")
    if not 0 <= ms <= _EPOCH_MS_LIMIT:
        raise InvalidDelay(f"at={at!r} is outside years 1970-9999")
    return ms


def due_spec(delay: object, at: object) -> tuple[str, int]:
    """The script's due argument: ('d', ms from the server's now) or ('a', epoch ms)."""
    if delay is not None and at is not None:
        raise InvalidDelay("give delay or at, not both")
    if at is not None:
        return "a", epoch_ms(at)
    return "d", duration_ms(0 if delay is None else delay)


# -- durations as people type and read them ---------------------------------------------------

_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER: Final = re.compile(r"\d+(?:\.\d*)?|\.\d+")  # no sign, no exponent: "1e3" is a typo
_PART: Final = re.compile(rf"({_NUMBER.pattern})(ms|s|m|h|d)")
_HINT: Final = "use seconds or units ms, s, m, h, d: 1.5, 250ms, 30s, 1h30m"
# Each unit above a second, with the next smaller one shown beside it.
_STEPS: Final = (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1))


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds from ``1.5``, ``30s``, ``5m``, ``1h30m``, ``250ms`` or ``2d`` (spaces and case
    ignored, each unit at most once); a :class:`ValueError` saying ``not a <what>`` else."""
    value = text.strip().replace(" ", "").lower()
    if _NUMBER.fullmatch(value):
        seconds = float(value)
    else:
        pos, seconds, seen = 0, 0.0, set()
        for match in _PART.finditer(value):
            if match.start() != pos or match.group(2) in seen:
                break
            seen.add(match.group(2))
            seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if not value or pos != len(value):
            reason = "must not be negative" if value.startswith("-") else _HINT
            raise ValueError(f"not a {what}: {text!r} ({reason})")
    if not math.isfinite(seconds):  # digits enough to overflow a float
        raise ValueError(f"not a {what}: {text!r} (must be finite)")
    return seconds


def format_duration(seconds: float, *, sep: str = "", coarse: bool = False) -> str:
    """A duration for people, its sign left to the caller (``in ...``, ``... ago``): ``250ms``,
    ``4.2s``, ``5m03s``, ``2h05m``, ``3d04h``, the two largest units joined by ``sep``.
    ``coarse``, for a glance: whole seconds or minutes alone, else two units with a zero
    smaller one left out (``5s``, ``3m``, ``2h 1m``, ``1d``)."""
    s = abs(seconds)
    if coarse:
        whole = int(s)
        if whole < 60:
            return f"{whole}s"
        if whole < 3600:
            return f"{whole // 60}m"
    else:
        if s < 1:
            return f"{s * 1000:.0f}ms"
        if s < 60:
            return f"{s:.1f}s"
        whole = int(s)
    big, size, small, step = next(units for units in _STEPS if whole >= units[1])
    major, minor = whole // size, whole % size // step
    if coarse:
        return f"{major}{big}{sep}{minor}{small}" if minor else f"{major}{big}"
    return f"{major}{big}{sep}{minor:02d}{small}"
