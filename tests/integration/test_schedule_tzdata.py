"""The tzdata release behind a schedule's cron times (issue #19): recorded with the times
ahead, shown in ScheduleInfo, and logged once per process when a process with another
release tops them up (a mixed fleet computes different local times after a rule change)."""

from __future__ import annotations

import logging
import shutil
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from delayq import DelayQueue
from delayq._core.tzsource import tz_source
from tests.helpers import wait_until

from .test_schedules import nudge

Make = Callable[..., DelayQueue]
ZONE = "Europe/Berlin"


@pytest.fixture
def other_release(tmp_path: Path) -> Iterator[Callable[[bool], None]]:
    """Switch this process between its own zone database and a copy that says it is
    release 2099z (the same rules: only the recorded release differs)."""
    real = tz_source(ZONE)
    copy = tmp_path / "zoneinfo"
    (copy / "Europe").mkdir(parents=True)
    shutil.copy(_zone_file(real.source), copy / ZONE)
    (copy / "tzdata.zi").write_text("# version 2099z\n")

    def use(other: bool) -> None:
        zoneinfo.reset_tzpath([str(copy)] if other else None)

    yield use
    zoneinfo.reset_tzpath()


def _zone_file(source: str) -> Path:
    if source.startswith("tzdata"):
        import tzdata

        return Path(tzdata.__file__).parent / "zoneinfo" / ZONE
    return Path(source) / ZONE


def top_up(q: DelayQueue, client: redis.Redis) -> None:
    """Leave one cron time ahead, so that the next fetch asks for more and ``q`` writes them."""
    at_key = f"{q.keys.prefix}:{{{q.name}}}:sched:at:ticker"
    client.zremrangebyrank(at_key, 1, -1)
    wait_until(lambda: nudge(q) and client.zcard(at_key) >= 8, timeout=10)


def test_the_release_is_recorded_and_a_mixed_fleet_is_logged_once(
    make_queue: Make,
    client: redis.Redis,
    other_release: Callable[[bool], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    real = tz_source(ZONE)
    q = make_queue("reports")
    info = q.schedules.upsert("ticker", "n", cron="* * * * * *", tz=ZONE)  # steps each second
    assert (info.tzdata, info.tzdata_source) == (real.version, real.source)
    every = q.schedules.upsert("beat", "b", every=60)
    assert every.tzdata is None, "interval times need no zone"
    caplog.set_level(logging.WARNING, logger="delayq")
    top_up(q, client)  # the same release: nothing to say
    assert not caplog.records
    other_release(True)
    top_up(q, client)
    assert q.schedules.get("ticker").tzdata == "2099z"
    other_release(False)
    top_up(q, client)
    other_release(True)
    top_up(q, client)  # this pair was said already
    said = [r.getMessage() for r in caplog.records if "tzdata" in r.getMessage()]
    assert len(said) == 2, said
    assert f"computed with tzdata {real.version}" in said[0] and "2099z" in said[0]
    assert "computed with tzdata 2099z" in said[1]
    assert q.schedules.get("ticker").tzdata == "2099z"
