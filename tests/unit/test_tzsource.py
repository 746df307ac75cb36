"""Which time zone database cron times are computed with (delayq._core.tzsource): the
directory of zoneinfo.TZPATH that holds the zone, with its release, else the tzdata
package; and how a schedule records and compares it."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from pathlib import Path

import pytest
import tzdata

from delayq._core.schedule_calls import tz_mismatch, tz_of, tz_text
from delayq._core.tzsource import TzSource, tz_source


@pytest.fixture
def tzpath() -> Iterator[None]:
    yield
    zoneinfo.reset_tzpath()  # back to the default (PYTHONTZPATH or the build's)


def fake_database(root: Path, version_file: str | None, text: str = "") -> Path:
    zone = root / "Europe" / "Berlin"
    zone.parent.mkdir(parents=True)
    zone.write_bytes(b"TZif fake")  # only its presence is looked at
    if version_file is not None:
        (root / version_file).write_text(text)
    return root


def test_the_directory_that_holds_the_zone_and_its_release(tmp_path: Path, tzpath: None) -> None:
    db = fake_database(tmp_path / "a", "tzdata.zi", "# version 2099z\n# ddeps\n")
    zoneinfo.reset_tzpath([str(db)])
    assert tz_source("Europe/Berlin") == TzSource("2099z", str(db))


def test_plus_version_and_unknown(tmp_path: Path, tzpath: None) -> None:
    plus = fake_database(tmp_path / "b", "+VERSION", "2098y\n")
    bare = fake_database(tmp_path / "c", None)
    zoneinfo.reset_tzpath([str(plus)])
    assert tz_source("Europe/Berlin").version == "2098y"
    zoneinfo.reset_tzpath([str(bare)])
    assert tz_source("Europe/Berlin") == TzSource("unknown", str(bare))


def test_a_zone_no_directory_has_comes_from_the_tzdata_package(
    tmp_path: Path, tzpath: None
) -> None:
    zoneinfo.reset_tzpath([str(fake_database(tmp_path / "d", "tzdata.zi", "# version 1\n"))])
    found = tz_source("America/New_York")  # not in the fake directory
    assert found.version == tzdata.IANA_VERSION and found.source.startswith("tzdata ")
    zoneinfo.reset_tzpath([])
    assert tz_source("Europe/Berlin").version == tzdata.IANA_VERSION


def test_the_system_database_when_there_is_one(tzpath: None) -> None:
    system = next((d for d in zoneinfo.TZPATH if (Path(d) / "Europe/Berlin").is_file()), None)
    if system is None or not (Path(system) / "tzdata.zi").is_file():
        pytest.skip("no system zone database with tzdata.zi here")
    first = (Path(system) / "tzdata.zi").read_text().splitlines()[0]
    assert tz_source("Europe/Berlin") == TzSource(first.split()[-1], system)


def test_recorded_text_round_trips_and_mismatches_are_worded() -> None:
    mine = TzSource("2025b", "/usr/share/zoneinfo")
    assert tz_of(tz_text(mine)) == mine
    assert tz_of(tz_text(mine).encode()) == mine
    assert tz_of(None) is None and tz_of(b"") is None
    assert tz_mismatch("nightly", None, mine) is None
    assert tz_mismatch("nightly", TzSource("2025b", "tzdata 2025.2"), mine) is None
    text = tz_mismatch("nightly", TzSource("2024a", "tzdata 2024.1"), mine)
    assert text is not None and "2024a (tzdata 2024.1)" in text and "2025b" in text
