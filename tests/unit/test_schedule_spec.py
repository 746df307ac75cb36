"""The pure schedule spec (delayq.Schedule): fire times with fake "now"s, DST per Debian cron,
interval alignment, validation. No Redis."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from delayq import ConfigError, Schedule
from delayq._core.schedule import SchedulePolicy, schedule_of, spec_hash


def local(tz: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)  # type: ignore[misc]


def utc_hm(times: list[datetime]) -> list[str]:
    return [t.astimezone(UTC).strftime("%m-%d %H:%M") for t in times]


def test_new_york_spring_forward_fires_at_the_jump_once() -> None:
    s = Schedule(cron="30 2 * * *", tz="America/New_York")
    fires = s.next_fires(local("America/New_York", 2026, 3, 7, 12), 3)
    # 02:30 does not exist on 03-08: it fires at 03:00 EDT (07:00Z), then 02:30 EDT again.
    assert utc_hm(fires) == ["03-08 07:00", "03-09 06:30", "03-10 06:30"]
    assert fires[0].hour == 3 and fires[0].minute == 0


def test_new_york_fall_back_fires_a_repeated_time_once() -> None:
    s = Schedule(cron="30 1 * * *", tz="America/New_York")
    fires = s.next_fires(local("America/New_York", 2026, 10, 31, 12), 3)
    assert utc_hm(fires) == ["11-01 05:30", "11-02 06:30", "11-03 06:30"]


def test_fire_times_are_stateless_from_the_previous_instant() -> None:
    # Starting from each previous fire (or from inside the repeated hour's second copy) gives
    # the same chain as iterating: no second 01:30 EST.
    s = Schedule(cron="30 1 * * *", tz="America/New_York")
    first = s.next_fires(local("America/New_York", 2026, 10, 31, 12), 1)[0]
    assert (
        s.next_fires(first, 1)[0] == s.next_fires(local("America/New_York", 2026, 10, 31, 12), 2)[1]
    )
    second_copy = local("America/New_York", 2026, 11, 1, 1, 15, fold=1)  # 01:15 EST
    assert utc_hm(s.next_fires(second_copy, 1)) == ["11-02 06:30"]


def test_hourly_follows_elapsed_time_through_fall_back() -> None:
    s = Schedule(cron="0 * * * *", tz="America/New_York")
    fires = s.next_fires(local("America/New_York", 2026, 11, 1, 0, 30), 4)
    assert utc_hm(fires) == ["11-01 05:00", "11-01 06:00", "11-01 07:00", "11-01 08:00"]
    assert [f.hour for f in fires] == [1, 1, 2, 3]  # 01:00 EDT and 01:00 EST both fire


def test_london_both_transitions() -> None:
    s = Schedule(cron="30 1 * * *", tz="Europe/London")
    spring = s.next_fires(local("Europe/London", 2026, 3, 28, 12), 2)
    assert utc_hm(spring) == ["03-29 01:00", "03-30 00:30"]  # 01:30 missing: at the jump, 02:00
    autumn = s.next_fires(local("Europe/London", 2026, 10, 24, 12), 3)
    assert utc_hm(autumn) == ["10-25 00:30", "10-26 01:30", "10-27 01:30"]  # once


def test_lord_howe_half_hour_shift() -> None:
    spring = Schedule(cron="15 2 * * *", tz="Australia/Lord_Howe")
    fires = spring.next_fires(local("Australia/Lord_Howe", 2026, 10, 3, 12), 2)
    assert [(f.hour, f.minute) for f in fires] == [(2, 30), (2, 15)]  # 02:00-02:30 skipped
    autumn = Schedule(cron="45 1 * * *", tz="Australia/Lord_Howe")
    fires = autumn.next_fires(local("Australia/Lord_Howe", 2026, 4, 4, 12), 2)
    assert utc_hm(fires) == ["04-04 14:45", "04-05 15:15"]  # 01:30-02:00 repeated: once


def test_santiago_midnight_transitions() -> None:
    s = Schedule(cron="0 0 * * *", tz="America/Santiago")
    spring = s.next_fires(local("America/Santiago", 2026, 9, 5, 12), 2)
    assert [(f.day, f.hour) for f in spring] == [(6, 1), (7, 0)]  # midnight missing: 01:00
    autumn = s.next_fires(local("America/Santiago", 2026, 4, 4, 12), 2)
    assert utc_hm(autumn) == ["04-05 04:00", "04-06 04:00"]  # once


def test_apia_skipped_day() -> None:
    s = Schedule(cron="0 12 * * *", tz="Pacific/Apia")
    fires = s.next_fires(local("Pacific/Apia", 2011, 12, 28, 13), 3)
    # 2011-12-30 does not exist in Samoa: its noon fires at the jump (the 31st, 00:00).
    assert [(f.day, f.hour) for f in fires] == [(29, 12), (31, 0), (31, 12)]
    assert all(b > a for a, b in itertools.pairwise(fires))


def test_seconds_field() -> None:
    s = Schedule(cron="*/15 * * * * *")
    fires = s.next_fires(datetime(2026, 1, 1, 0, 0, 7, 500000, tzinfo=UTC), 3)
    assert [f.second for f in fires] == [15, 30, 45]


def test_every_is_aligned_to_its_phase_not_to_the_last_run() -> None:
    s = Schedule(every=timedelta(minutes=5), phase=60)
    fires = s.next_fires(datetime(2026, 1, 1, 0, 3, 59, tzinfo=UTC), 3)
    assert [(f.minute, f.second) for f in fires] == [(6, 0), (11, 0), (16, 0)]
    exact = s.next_fires(datetime(2026, 1, 1, 0, 6, tzinfo=UTC), 1)
    assert exact[0].minute == 11  # strictly after


def test_every_and_phase_are_exact_milliseconds() -> None:
    s = Schedule(every=timedelta(seconds=11), phase=timedelta(milliseconds=4030))
    assert (s.every_ms, s.phase_ms) == (11000, 4030)  # not 4031, as 4.03 * 1000 rounds up
    assert Schedule(every=0.3, phase=0.1).phase_ms == 100


def test_start_and_end_bound_the_fires() -> None:
    start = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
    end = datetime(2026, 1, 1, 0, 20, tzinfo=UTC)
    s = Schedule(every=300, start=start, end=end)
    fires = s.next_fires(datetime(2026, 1, 1, tzinfo=UTC), 10)
    assert [f.minute for f in fires] == [10, 15, 20]
    assert s.fires_between_ms(0, 2**62, 100) == [round(f.timestamp() * 1000) for f in fires]


def test_round_trip_through_stored_form() -> None:
    s = Schedule(cron="0 9 * * 1-5", tz="Europe/Berlin", start=datetime(2026, 1, 1, tzinfo=UTC))
    assert schedule_of(s.as_dict()) == s
    e = Schedule(every=timedelta(seconds=90), phase=30)
    back = schedule_of(e.as_dict())
    assert (back.every_ms, back.phase_ms) == (90000, 30000)


def test_explain() -> None:
    assert Schedule(cron="0 9 * * 1-5").explain() == "At 09:00 on Monday through Friday"
    assert "Europe/Berlin" in Schedule(cron="0 9 * * *", tz="Europe/Berlin").explain()
    assert Schedule(every=90).explain() == "Every 0:01:30, aligned to the Unix epoch"


def test_spec_hash_changes_with_every_field() -> None:
    base = Schedule(every=60), SchedulePolicy(), b"=1"
    h = spec_hash(*base)
    assert spec_hash(Schedule(every=60), SchedulePolicy(), b"=1") == h
    assert spec_hash(Schedule(every=61), SchedulePolicy(), b"=1") != h
    assert spec_hash(Schedule(every=60), SchedulePolicy(overlap="allow_all"), b"=1") != h
    assert spec_hash(Schedule(every=60), SchedulePolicy(), b"=2") != h


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of cron= and every="),
        ({"cron": "* * * * *", "every": 5}, "exactly one"),
        ({"cron": "* * *"}, "5 fields"),
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 0}, "every must be > 0"),
        ({"every": -1}, "every must be"),
        ({"every": 60, "phase": 60}, "phase must be shorter"),
        ({"every": 60, "start": datetime(2026, 1, 1)}, "aware datetime"),
        (
            {
                "every": 60,
                "start": datetime(2026, 1, 2, tzinfo=UTC),
                "end": datetime(2026, 1, 1, tzinfo=UTC),
            },
            "end must not be before start",
        ),
    ],
)
def test_bad_specs_are_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Schedule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlap": "replace"}, "overlap must be one of"),
        ({"catchup": "none"}, "catchup must be one of"),
        ({"max_fires": 0}, "max_fires"),
        ({"jitter": -1}, "jitter"),
        ({"catchup_window": 0}, "catchup_window"),
        ({"priority": 10}, "priority"),
    ],
)
def test_bad_policies_are_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SchedulePolicy.of(**kwargs)
