"""Which time zone database this process computes cron times with (docs/schedules.md).

``zoneinfo`` reads a zone from the first directory of ``zoneinfo.TZPATH`` that has it (the
system's, e.g. ``/usr/share/zoneinfo``) and only then from the ``tzdata`` package, so the
package's version alone does not say which rules apply. Two processes with different rules
compute different local times once a zone's rules change (a DST date moved by law): each
schedule records the version its cron times ahead were computed with, and a process with
another one says so when it adds times.
"""

from __future__ import annotations

import re
import zoneinfo
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

_VERSION_LINE = re.compile(rb"#\s*version\s+(\S+)")


class TzSource(NamedTuple):
    """The IANA release (``2025b``; ``unknown`` if the directory does not say) and where it
    was read from (a directory of ``TZPATH``, or ``tzdata <package version>``)."""

    version: str
    source: str


def tz_source(key: str) -> TzSource:
    """Where ``zoneinfo`` finds zone ``key`` in this process, and that database's release."""
    return _source(key, tuple(zoneinfo.TZPATH))


@cache
def _source(key: str, tzpath: tuple[str, ...]) -> TzSource:
    for directory in tzpath:
        if (Path(directory) / key).is_file():
            return TzSource(_directory_version(Path(directory)), directory)
    return _package_source()


def _directory_version(directory: Path) -> str:
    # Debian and most distributions ship tzdata.zi ("# version 2025b" on its first line);
    # some ship +VERSION instead.
    try:
        with (directory / "tzdata.zi").open("rb") as text:
            found = _VERSION_LINE.match(text.readline())
        if found:
            return found.group(1).decode("ascii", "replace")
    except OSError:
        pass
    try:
        return (directory / "+VERSION").read_text("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def _package_source() -> TzSource:
    try:
        import tzdata  # type: ignore[import-untyped]  # a dependency; zoneinfo's fallback

        return TzSource(str(tzdata.IANA_VERSION), f"tzdata {version('tzdata')}")
    except (ImportError, AttributeError, PackageNotFoundError):  # absent, or an odd build
        return TzSource("unknown", "tzdata package")
