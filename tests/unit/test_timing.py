"""Validation of delays, due times and durations (delayq._core.timing): pure, no Redis."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal

import pytest

from delayq import InvalidDelay, InvalidTaskError
from delayq._core.timing import (
    MAX_DELAY_MS,
    due_spec,
    duration_ms,
    epoch_ms,
    format_duration,
    parse_duration,
)

CENTURY_S = 100 * 365 * 24 * 3600


class _NoOffset(tzinfo):
    """A tzinfo that does not know its offset: the datetime is effectively naive."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None


# -- duration_ms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (0.0, 0),
        (1, 1000),
        (2.5, 2500),
        (0.0001, 1),  # rounded up: never early
        (0.0015, 2),
        (1.0001, 1001),
        (timedelta(0), 0),
        (timedelta(seconds=3), 3000),
        (timedelta(milliseconds=1, microseconds=1), 2),
        (timedelta(days=1), 86_400_000),
        (CENTURY_S, MAX_DELAY_MS),  # exactly a century is still allowed
        (timedelta(days=36500), MAX_DELAY_MS),
    ],
)
def test_duration_ms_accepts_seconds_and_timedeltas(value: object, expected: int) -> None:
    assert duration_ms(value) == expected


def test_duration_ms_is_an_int() -> None:
    assert type(duration_ms(1.5)) is int
    assert type(duration_ms(timedelta(seconds=1))) is int


@pytest.mark.parametrize(
    "value",
    [
        -1,
        -0.001,
        -1e-9,
        timedelta(seconds=-1),
        timedelta(microseconds=-1),
        -1e308,
    ],
)
def test_duration_ms_rejects_negative(value: object) -> None:
    with pytest.raises(InvalidDelay, match=">= 0"):
        duration_ms(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, float("nan")])
def test_duration_ms_rejects_non_finite(value: float) -> None:
    with pytest.raises(InvalidDelay, match="finite"):
        duration_ms(value)


@pytest.mark.parametrize(
    "value",
    [True, False, "1", "1.5", b"1", None, [1], Decimal("1"), object(), 1j],
)
def test_duration_ms_rejects_non_numbers(value: object) -> None:
    with pytest.raises(InvalidDelay, match="seconds"):
        duration_ms(value)


@pytest.mark.parametrize(
    "value",
    [
        CENTURY_S + 0.001,
        CENTURY_S + 1,
        timedelta(days=36501),
        timedelta.max,
        1e12,  # milliseconds passed as seconds: the unit mistake this guards against
        2**53,
    ],
)
def test_duration_ms_rejects_more_than_a_century(value: object) -> None:
    with pytest.raises(InvalidDelay, match="century"):
        duration_ms(value)


@pytest.mark.parametrize("value", [1e308, 10**400], ids=["1e308", "10**400"])
def test_duration_ms_rejects_astronomical_delays_as_invalid_delay(value: object) -> None:
    with pytest.raises(InvalidDelay):
        duration_ms(value)


def test_duration_ms_zero_can_be_forbidden() -> None:
    with pytest.raises(InvalidDelay, match="> 0"):
        duration_ms(0, "visibility_timeout", allow_zero=False)
    with pytest.raises(InvalidDelay, match="> 0"):
        duration_ms(timedelta(0), allow_zero=False)
    assert duration_ms(0.001, allow_zero=False) == 1


def test_duration_ms_names_the_argument_in_errors() -> None:
    with pytest.raises(InvalidDelay, match=r"^key_ttl"):
        duration_ms(-1, "key_ttl")


def test_invalid_delay_is_an_invalid_task_and_a_value_error() -> None:
    with pytest.raises(InvalidTaskError):
        duration_ms(-1)
    with pytest.raises(ValueError):
        duration_ms(math.nan)


# -- epoch_ms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (0, 0),
        (1.5, 1500),
        (1_700_000_000, 1_700_000_000_000),
        (1_700_000_000.0001, 1_700_000_000_001),  # rounded up
        (datetime(2024, 1, 1, tzinfo=UTC), 1_704_067_200_000),
        (datetime(2024, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))), 1_704_067_200_000),
        (datetime(2024, 1, 1, 0, 0, 0, 500, tzinfo=UTC), 1_704_067_200_001),
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), 253_402_300_799_000),
    ],
)
def test_epoch_ms_accepts_aware_datetimes_and_epoch_seconds(at: object, expected: int) -> None:
    assert epoch_ms(at) == expected


@pytest.mark.parametrize(
    "at",
    [datetime(2024, 1, 1), datetime.now(), datetime(2024, 1, 1, tzinfo=_NoOffset())],
    ids=["naive", "naive-now", "tzinfo-without-offset"],
)
def test_epoch_ms_rejects_naive_datetimes(at: datetime) -> None:
    with pytest.raises(InvalidDelay, match="timezone-aware"):
        epoch_ms(at)


@pytest.mark.parametrize("at", [math.nan, math.inf, -math.inf])
def test_epoch_ms_rejects_non_finite(at: float) -> None:
    with pytest.raises(InvalidDelay, match="finite"):
        epoch_ms(at)


@pytest.mark.parametrize("at", [True, False, "2024-01-01", None, timedelta(seconds=1), [0]])
def test_epoch_ms_rejects_other_types(at: object) -> None:
    with pytest.raises(InvalidDelay, match="aware datetime or epoch seconds"):
        epoch_ms(at)


@pytest.mark.parametrize(
    "at",
    [
        -1,
        -0.01,
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        253_402_300_800,  # 10000-01-01
        1e15,  # epoch milliseconds passed as seconds
    ],
)
def test_epoch_ms_rejects_times_outside_1970_to_9999(at: object) -> None:
    with pytest.raises(InvalidDelay, match="outside years"):
        epoch_ms(at)


@pytest.mark.parametrize("at", [1e308, 10**400], ids=["1e308", "10**400"])
def test_epoch_ms_rejects_astronomical_times_as_invalid_delay(at: object) -> None:
    with pytest.raises(InvalidDelay):
        epoch_ms(at)


# -- due_spec ---------------------------------------------------------------------------------


def test_due_spec_defaults_to_now() -> None:
    assert due_spec(None, None) == ("d", 0)


def test_due_spec_relative_delay() -> None:
    assert due_spec(1.5, None) == ("d", 1500)
    assert due_spec(timedelta(minutes=1), None) == ("d", 60_000)
    assert due_spec(0, None) == ("d", 0)


def test_due_spec_absolute_time() -> None:
    assert due_spec(None, 1_700_000_000) == ("a", 1_700_000_000_000)
    assert due_spec(None, datetime(2024, 1, 1, tzinfo=UTC)) == ("a", 1_704_067_200_000)
    assert due_spec(None, 0) == ("a", 0)  # at=0 is a time, not "no time"


@pytest.mark.parametrize(
    ("delay", "at"),
    [
        (1, 1_700_000_000),
        (0, 0),
        (timedelta(seconds=1), datetime(2024, 1, 1, tzinfo=UTC)),
    ],
)
def test_due_spec_rejects_both_delay_and_at(delay: object, at: object) -> None:
    with pytest.raises(InvalidDelay, match="not both"):
        due_spec(delay, at)


@pytest.mark.parametrize(
    ("delay", "at"),
    [
        (-1, None),
        (math.nan, None),
        (True, None),
        ("5", None),
        (CENTURY_S + 1, None),
        (None, datetime(2024, 1, 1)),
        (None, -5),
        (None, math.inf),
        (None, "now"),
    ],
)
def test_due_spec_validates_what_it_gets(delay: object, at: object) -> None:
    with pytest.raises(InvalidDelay):
        due_spec(delay, at)


# -- durations as people type and read them -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("2.", 2.0),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1.5m", 90.0),
        ("2h", 7200.0),
        ("2d", 172_800.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        (" 5M ", 300.0),
        ("30s1h", 3630.0),  # any order, each unit once
        ("1m500ms", 60.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("soon", "use seconds"),
        ("", "use seconds"),
        ("1h1h", "use seconds"),  # a unit twice is a typo
        ("200y", "use seconds"),
        ("1e3", "use seconds"),  # no exponents
        ("nan", "use seconds"),
        ("inf", "use seconds"),
        ("5 s s", "use seconds"),
        ("-5s", "must not be negative"),
        ("-1", "must not be negative"),
        ("9" * 400, "must be finite"),
    ],
)
def test_parse_duration_says_what_is_wrong(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^not a delay: {re.escape(repr(text))} \\(.*{reason}"):
        parse_duration(text, "delay")


@pytest.mark.parametrize(
    ("seconds", "shown", "spaced", "coarse"),
    [
        (0, "0ms", "0ms", "0s"),
        (0.0154, "15ms", "15ms", "0s"),
        (0.4, "400ms", "400ms", "0s"),
        (4.2, "4.2s", "4.2s", "4s"),
        (-4.2, "4.2s", "4.2s", "4s"),  # the sign is the caller's ("in", "ago")
        (59.5, "59.5s", "59.5s", "59s"),
        (60, "1m00s", "1m 00s", "1m"),
        (185, "3m05s", "3m 05s", "3m"),  # at a glance, minutes alone
        (3599, "59m59s", "59m 59s", "59m"),
        (3600, "1h00m", "1h 00m", "1h"),
        (7300, "2h01m", "2h 01m", "2h 1m"),
        (86_399, "23h59m", "23h 59m", "23h 59m"),
        (90_000, "1d01h", "1d 01h", "1d 1h"),
        (172_800, "2d00h", "2d 00h", "2d"),
        (10 * 86_400 + 5 * 3600, "10d05h", "10d 05h", "10d 5h"),
    ],
)
def test_format_duration(seconds: float, shown: str, spaced: str, coarse: str) -> None:
    assert format_duration(seconds) == shown
    assert format_duration(seconds, sep=" ") == spaced
    assert format_duration(seconds, sep=" ", coarse=True) == coarse
