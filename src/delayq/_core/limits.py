"""Flow control (issue #20), the pure part: pausing a queue and limits (:class:`Limit`), the
script arguments and replies of ``limit_pause.lua`` and ``limit_admin.lua``. The Lua side is
in ``lua/_lib.lua`` (its flow-control section), ``lua/limit_*.lua`` and the marked blocks of
``lua/fetch.lua``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from ..exceptions import ConfigError, InvalidDelay, InvalidTaskError
from .models import to_datetime
from .protocol import MAX_KEY_LEN, _utf8
from .sharding import shard_of
from .timing import Duration, duration_ms, epoch_ms

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


# -- limits --------------------------------------------------------------------------------

WHOLE_QUEUE: Final = "*"  # the limit key of a limit on the whole queue
DEFAULT_KEY: Final = "~default"  # the limit of every key that has none of its own
# The exporter labels the queue's totals key="_all" (metrics/_collector.py): not a limit key.
EXPORTER_TOTAL: Final = "_all"
# Why a limit held tasks back: each has a count per key (lua/_lib.lua count_throttled).
THROTTLE_REASONS: Final = ("rate", "concurrency", "ratelimited")
_MAX_WEIGHT: Final = 1000


@dataclass(frozen=True, slots=True)
class Limit:
    """Flow control for one limit key (a tenant, a downstream API) or the whole queue.

    ``rate`` tasks may start per ``per`` seconds (GCRA on the server's clock: evenly spaced,
    with up to ``burst`` at once after a quiet spell; the default burst is 1). At most
    ``concurrency`` of the key's tasks may be leased at once (a lease that ends, by ack, nack,
    retry, reject or expiry, frees its slot). ``weight`` is kept for fair scheduling across
    keys. A task over its limit waits in Redis until the exact time it may start: it is not
    retried, not counted as an attempt and never dead-lettered for it.
    """

    rate: float | None = None
    per: Duration = 1.0
    burst: int | None = None
    concurrency: int | None = None
    weight: int = 1

    def __post_init__(self) -> None:
        if self.rate is not None and (
            isinstance(self.rate, bool)
            or not isinstance(self.rate, int | float)
            or not math.isfinite(self.rate)
            or self.rate <= 0
        ):
            raise ConfigError(f"rate must be a number > 0, not {self.rate!r}")
        try:
            per_ms = duration_ms(self.per, "per", allow_zero=False)
        except InvalidDelay as exc:
            raise ConfigError(str(exc)) from exc
        if self.rate is not None and per_ms * 1000 / self.rate < 1:
            raise ConfigError(f"rate {self.rate!r} per {self.per!r} s is over 1 per microsecond")
        if self.burst is not None:
            if self.rate is None:
                raise ConfigError("burst needs a rate")
            _check_count(self.burst, "burst")
        if self.concurrency is not None:
            _check_count(self.concurrency, "concurrency")
        _check_count(self.weight, "weight", _MAX_WEIGHT)
        if self.rate is None and self.concurrency is None and self.weight == 1:
            raise ConfigError("a Limit needs a rate, a concurrency or a weight")

    def encode(self) -> str:
        """The limit as the scripts read it: ``rate|per_us|burst|concurrency|weight``."""
        per_us = duration_ms(self.per, "per", allow_zero=False) * 1000
        rate = "" if self.rate is None else repr(float(self.rate))
        burst = "" if self.rate is None else str(self.burst or 1)
        concurrency = "" if self.concurrency is None else str(self.concurrency)
        return f"{rate}|{per_us}|{burst}|{concurrency}|{self.weight}"

    @classmethod
    def decode(cls, spec: str) -> Limit:
        rate, per_us, burst, concurrency, weight = spec.split("|")
        value = float(rate) if rate else None
        return cls(
            rate=int(value) if value is not None and value.is_integer() else value,
            per=int(per_us) / 1_000_000,
            burst=int(burst) if rate and burst != "1" else None,
            concurrency=int(concurrency) if concurrency else None,
            weight=int(weight),
        )


def _check_count(value: object, what: str, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be an int >= 1, not {value!r}")
    if most is not None and value > most:
        raise ConfigError(f"{what} must be at most {most}, not {value!r}")


def check_limit_key(value: object, *, offered: bool = False) -> str:
    """A valid limit key: a non-empty UTF-8 string without ``|``. ``"*"`` (the whole queue)
    and keys starting with ``~`` (``"~default"``) name limits, not tasks' keys."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_KEY_LEN
        or "|" in value
        or not _utf8(value)
    ):
        raise ConfigError(
            f"limit key must be a non-empty UTF-8 string of at most {MAX_KEY_LEN} chars "
            f"without '|', not {value!r}"
        )
    if value == EXPORTER_TOTAL:
        error = f"limit key {value!r} is reserved: the exporter's series of the queue's total"
        raise InvalidTaskError(error) if offered else ConfigError(error)
    reserved = value == WHOLE_QUEUE or value.startswith("~")
    if offered and reserved:
        raise InvalidTaskError(f"limit_key {value!r} is reserved: '*' and '~...' name limits")
    if not offered and value.startswith("~") and value != DEFAULT_KEY:
        raise ConfigError(f"limit key {value!r}: keys starting with '~' are reserved")
    return value


def offered_limit_key(value: object) -> str | None:
    """An offer's ``limit_key``, checked (InvalidTaskError: nothing is written)."""
    if value is None:
        return None
    try:
        return check_limit_key(value, offered=True)
    except ConfigError as exc:
        raise InvalidTaskError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """A limit key as ``q.limits.get``/``list`` see it: its limit (None: the key has none of
    its own; ``limit_of`` says which applies), its leases running, its tasks waiting and when
    the first of them may start (None: when a slot frees, or nothing waits)."""

    key: str
    limit: Limit | None
    running: int
    waiting: int
    next_admission_at: datetime | None
    limit_of: str | None  # the key whose Limit applies: key, "~default" or None


def parse_limit_rows(reply: Sequence[Any]) -> list[LimitInfo]:
    """Rows of ``limit_admin`` get/list: key, own spec, running, waiting, gate ms, default."""
    rows = []
    for i in range(0, len(reply), 6):
        key, spec = _text(reply[i]), _text(reply[i + 1])
        default = _text(reply[i + 5])
        gate = int(reply[i + 4])
        limit = Limit.decode(spec) if spec else None
        applies = key if spec else (DEFAULT_KEY if default and key != WHOLE_QUEUE else None)
        rows.append(
            LimitInfo(
                key,
                limit,
                int(reply[i + 2]),
                int(reply[i + 3]),
                to_datetime(gate) if gate >= 0 else None,
                applies,
            )
        )
    return rows


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_same_shard(key: str, limit_key: str, shards: int) -> None:
    """On a sharded queue a task goes to its limit key's shard (so the limit is exact) and
    its dedup key must live there too; refuse a pair that routes apart."""
    if shard_of(key, shards) != shard_of(limit_key, shards):
        raise InvalidTaskError(
            f"on a sharded queue a task's key ({key!r}) and limit_key ({limit_key!r}) must "
            "route to one shard; offer it with one of them"
        )
