"""Flow control (issue #20), the pure part: pausing a queue, and the script arguments and
replies of ``limit_pause.lua``. The Lua side is in ``lua/_lib.lua`` (its flow-control
section), ``lua/limit_*.lua`` and the marked blocks of ``lua/fetch.lua``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import ConfigError, InvalidDelay
from .models import to_datetime
from .timing import duration_ms, epoch_ms

PauseUntil = datetime | float | int | timedelta


@dataclass(frozen=True, slots=True)
class PauseInfo:
    """A queue's pause, as :meth:`DelayQueue.pause` leaves it (or a read finds it)."""

    paused: bool
    until: datetime | None = None  # a timed pause's end (server clock); None: until resumed
    since: datetime | None = None  # when the pause began
    note: str | None = None  # why, as the operator wrote it


def pause_args(until: PauseUntil | None, note: str | None) -> list[Any]:
    """The arguments of a ``pause`` call: ``until`` is an aware datetime or epoch seconds
    (a point in time, as ``at`` is for an offer) or a timedelta (that long from the server's
    now); None pauses until :meth:`resume`."""
    if note is not None and not isinstance(note, str):
        raise ConfigError(f"note must be a str, not {note!r}")
    if until is None:
        spec = ""
    elif isinstance(until, timedelta):
        try:
            spec = f"d{duration_ms(until, 'until', allow_zero=False)}"
        except InvalidDelay as exc:
            raise ConfigError(str(exc)) from exc
    else:
        try:
            spec = f"a{epoch_ms(until)}"
        except InvalidDelay as exc:
            raise ConfigError(str(exc).replace("at", "until", 1)) from exc
    return ["pause", spec, note or ""]


def parse_pause(reply: Sequence[Any]) -> PauseInfo:
    """The :class:`PauseInfo` of a pause or read reply; refuses a pause that ends in the past."""
    status, until_ms, since_ms = int(reply[0]), int(reply[1]), int(reply[2])
    if status == 2:
        raise ConfigError(f"until ({to_datetime(until_ms)}) is not after the server's now")
    if status == 0:
        return PauseInfo(False)
    note = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
    return PauseInfo(True, to_datetime(until_ms or None), to_datetime(since_ms), note or None)
