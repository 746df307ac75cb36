"""Arguments and replies of every script: pure functions, shared by both front ends."""

from __future__ import annotations

import base64
import dataclasses
import enum
import itertools
import math
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal, NamedTuple

from ..exceptions import InvalidTaskError, ServerError
from .errors_text import error_summary
from .history import origin
from .models import DedupMode, Stats, to_datetime
from .text import utf8_safe

# Base64 re-lettered with an ASCII-sorted alphabet, so ids sort like the numbers they encode:
# same-millisecond ties among one process's tasks come out in offer order.
_ALPHABET: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
_RELETTER: Final = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", _ALPHABET.encode()
)
_counter = itertools.count(random.getrandbits(12))  # processes start apart
MAX_ID_LEN: Final = 256
MAX_KEY_LEN: Final = 512
OFFER_CHUNK: Final = 1000  # tasks per offer script call: keeps each call well under 10 ms
# Most tasks per fetch or ack call: scripts pass a batch to one command with unpack(), and
# Redis's Lua takes at most 8,000 values per call (2 per task in HSET/ZADD).
MAX_BATCH: Final = 1000
# Upper bounds of the delivery-lateness buckets the fetch script counts (LATE_BOUNDS there).
LATENESS_BUCKETS_MS: Final = (
    1,
    2,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
    30000,
    60000,
)


ID_LENGTH: Final = 14
_id_lock = threading.Lock()
_last_stamp = 0


def new_task_id() -> str:
    """A 14-character id: 48 bits of ms, a 12-bit process counter, 24 random bits.

    The (ms, counter) stamp only grows within a process: a counter wrap or a clock step back
    carries into the next millisecond rather than breaking the sort order. 14 characters keep
    the id in jemalloc's 16-byte class in both places Redis stores it. Two processes can still
    draw the same id: the offer scripts report it (status 3) and the queue draws again.
    """
    raw = ((_stamps(1) << 24 | random.getrandbits(24)) << 12).to_bytes(12, "big")
    return base64.b64encode(raw).translate(_RELETTER)[:ID_LENGTH].decode()


def _stamps(count: int) -> int:
    """The first of ``count`` consecutive (ms, counter) stamps, each above any made before."""
    global _last_stamp
    stamp = (time.time_ns() // 1_000_000) << 12 | (next(_counter) & 0xFFF)
    with _id_lock:
        first = max(stamp, _last_stamp + 1)
        _last_stamp = first + count - 1
    return first


def new_task_ids(count: int) -> list[str]:
    """``count`` ids as :func:`new_task_id` makes them, in increasing order, encoded at once
    (a bulk offer spends a fraction of a microsecond per id)."""
    first = _stamps(count)
    draw = random.getrandbits
    # 84 bits shifted into 12 bytes, i.e. 16 letters of which the last two are always zero
    raw = b"".join((((first + k) << 24 | draw(24)) << 12).to_bytes(12, "big") for k in range(count))
    text = base64.b64encode(raw).translate(_RELETTER).decode()
    return [text[i : i + ID_LENGTH] for i in range(0, len(text), 16)]


def new_nonce() -> str:
    """A lease-token prefix unique to one fetch call."""
    return os.urandom(8).hex()


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_id(value: object, what: str = "id") -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN or not _utf8(value):
        raise InvalidTaskError(
            f"{what} must be a non-empty UTF-8 string of at most {MAX_ID_LEN} chars"
        )
    return value


def check_key(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LEN or not _utf8(value):
        raise InvalidTaskError(
            f"key must be a non-empty UTF-8 string of at most {MAX_KEY_LEN} chars"
        )
    return value


def check_priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 9:
        raise InvalidTaskError(f"priority must be an int from 0 to 9, got {value!r}")
    return value


def check_headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and _utf8(k) and _utf8(v)
        for k, v in value.items()
    ):
        raise InvalidTaskError("headers must be a mapping of str to str, each valid UTF-8")
    return dict(value)


class OfferSpec(NamedTuple):
    """One validated, encoded task ready for the offer script (a tuple: cheap to build in bulk)."""

    id: str
    due: str  # 'd' + ms from the server's now, or 'a' + epoch ms
    envelope: bytes
    options: str = ""  # '' or 'priority|key_ttl_ms|ttl_ms|key'


def offer_options(
    priority: int, key: str | None, key_ttl_ms: int, ttl_ms: int, limit_key: str | None = None
) -> str:
    limited = "" if limit_key is None else f"@{limit_key}|"  # [L] see offer.lua
    if not priority and key is None and not ttl_ms:
        return limited
    return f"{limited}{priority}|{key_ttl_ms}|{ttl_ms}|{key or ''}"


def _split_limit_key(options: str) -> tuple[str | None, str]:
    """[L] An options field's limit key (if any) and the rest."""
    if not options.startswith("@"):
        return None, options
    limit_key, _, rest = options[1:].partition("|")
    return limit_key, rest


def spec_key(spec: OfferSpec) -> str | None:
    """The dedup key an encoded offer carries in its options, if any."""
    options = _split_limit_key(spec.options)[1]
    key = options.split("|", 3)[3] if options else ""
    return key or None


def spec_limit_key(spec: OfferSpec) -> str | None:
    """[L] The limit key an encoded offer carries in its options, if any."""
    return _split_limit_key(spec.options)[0]


# The offer script's own mode for at-most-once tasks fetched but never handed out, put back
# by close(): as "keep", but a key kept for the task's own id (its fetch finished it) is the
# task's again. Not a dedup option.
HANDED_BACK: Final = "back"
OfferMode = DedupMode | Literal["back"]


def spec_route(spec: OfferSpec) -> str:
    """What places an encoded offer on a shard: its limit key (a key's tasks share one),
    else its dedup key (so dedup holds), else its id."""
    return spec_limit_key(spec) or spec_key(spec) or spec.id


def offer_args(mode: OfferMode, specs: Sequence[OfferSpec]) -> list[Any]:
    """Arguments of an offer call (offer.lua); who offers is for a queue's task histories."""
    args: list[Any] = [str(mode), origin()]
    for spec in specs:
        args += spec
    return args


# An offer script's status for an id held by a task with other content, and how many ids the
# queue draws for one task before it gives up (84 random-enough bits: a second draw is rare).
ID_TAKEN: Final = 3
ID_DRAWS: Final = 5
# [H] offer_one.lua's status for a queue that keeps task histories: nothing written, offer
# through offer.lua, which records them.
HISTORY_ON: Final = 5


# The offer scripts' error for a (sub-)queue that a finished reshard retired: the writer's
# layout is stale, so it reads the layout again and writes to the current one.
LAYOUT_RETIRED: Final = "LAYOUT_RETIRED"


def layout_retired(exc: BaseException) -> bool:
    """Whether a script's error says the writer's layout is stale (:data:`LAYOUT_RETIRED`)."""
    return isinstance(exc, ServerError) and LAYOUT_RETIRED in str(exc)


def no_free_id() -> ServerError:
    return ServerError(f"{ID_DRAWS} drawn task ids were all taken: is the clock or RNG stuck?")


def parse_offer(reply: Sequence[Any]) -> list[tuple[str, int]]:
    """(id, status) per task: 1 created, 2 replaced, 0 an existing task matched, 3 another
    task holds the id."""
    return [(_id(reply[i]), int(reply[i + 1])) for i in range(0, len(reply), 2)]


@dataclass(frozen=True, slots=True)
class RawTask:
    """A delivered task before its envelope is decoded."""

    id: str  # as Redis holds it, bytes that are not UTF-8 kept as lone surrogates
    envelope: bytes
    attempts: int
    due_ms: int
    priority: int
    token: str | None  # the lease's; None at most once
    # At most once: what the offer gave beyond the envelope, "key_ttl ms,ttl deadline ms,limit
    # key" ('' for none), for putting back a task fetched but never handed out (kept_options)
    kept: str = ""

    @property
    def id_bytes(self) -> bytes:
        """The id exactly as Redis holds it, to address the task whatever another client
        wrote."""
        return self.id.encode("utf-8", "surrogateescape")

    @property
    def id_is_utf8(self) -> bool:
        """Whether the id is text this library can hand to a handler (else it is buried)."""
        return _utf8(self.id)


@dataclass(frozen=True, slots=True)
class FetchResult:
    now_us: int  # server time
    next_wake_ms: int | None  # earliest due time or lease expiry still ahead
    tasks: list[RawTask]
    acked: list[bool] = dataclasses.field(default_factory=list)  # of the acks sent along
    # [S] schedules short of cron times ahead: the client computes and writes more
    low_schedules: tuple[str, ...] = ()

    @property
    def now_ms(self) -> int:
        return self.now_us // 1000

    def seconds_until(self, ms: int) -> float:
        """Seconds from this reply's server time until epoch ``ms``."""
        return (ms * 1000 - self.now_us) / 1_000_000


@dataclass(frozen=True, slots=True)
class Policy:
    """The per-queue settings the scripts need on each call."""

    lease_ms: int  # 0 = at-most-once
    max_attempts: int
    backoff: Any  # models.Backoff
    housekeeping: int = 100


def fetch_args(policy: Policy, count: int, keep_ms: int) -> list[Any]:
    """Arguments of a fetch call; its nonce (args[2]) also names the call's receipt key."""
    base, cap, factor = policy.backoff.args()
    return [
        count,
        policy.lease_ms,
        new_nonce(),
        policy.max_attempts,
        base,
        cap,
        factor,
        policy.housekeeping,
        keep_ms,
        origin(),  # the consumer, in a queue's task histories
    ]


def score_pairs(reply: Sequence[Any]) -> list[tuple[Any, Any]]:
    """A ``WITHSCORES`` reply as (member, score) pairs, flat or already paired (redis-py
    pairs it only when asked through its own methods)."""
    if reply and isinstance(reply[0], tuple | list):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


def kept_options(kept: str, now_ms: int) -> dict[str, Any]:
    """The options of an at-most-once task put back by close() (:attr:`RawTask.kept`): its
    key_ttl, its limit key, and what is left at ``now_ms`` (server clock) of its ttl (a
    millisecond if nothing: it expires at the next look, never delivered)."""
    if not kept:
        return {}
    key_ttl_ms, deadline_ms, limit_key = kept.split(",", 2)
    options: dict[str, Any] = {}
    if int(key_ttl_ms) > 0:
        options["key_ttl"] = timedelta(milliseconds=int(key_ttl_ms))
    if deadline_ms:
        options["ttl"] = timedelta(milliseconds=max(1, int(float(deadline_ms)) - now_ms))
    if limit_key:
        options["limit_key"] = limit_key
    return options


def parse_fetch(reply: Sequence[Any], leased: bool = True) -> FetchResult:
    """A fetch's reply; ``leased`` False for an at-most-once fetch (no lease tokens)."""
    acks = _str(reply[2])
    low: tuple[str, ...] = ()
    if (len(reply) - 3) % 6 == 1:  # [S] the trailing signal after the task groups
        low = tuple(_str(name) for name in reply[-1])
        reply = reply[:-1]
    tasks = [
        RawTask(
            id=_id(reply[i]),
            envelope=bytes(reply[i + 1]),
            attempts=int(reply[i + 2]),
            due_ms=int(reply[i + 3]),
            priority=9 - int(reply[i + 4]),
            token=(_str(reply[i + 5]) or None) if leased else None,
            kept="" if leased else _str(reply[i + 5]),
        )
        for i in range(3, len(reply), 6)
    ]
    wake = int(reply[1])
    return FetchResult(
        int(reply[0]), None if wake < 0 else wake, tasks, [c == "1" for c in acks], low
    )


def nack_args(
    policy: Policy,
    task_id: str | bytes,
    token: str,
    outcome: str,
    delay_ms: int,
    error: str,
    due_ms: int | None = None,
) -> list[Any]:
    """Arguments of a nack call; ``error`` may hold anything (it is made valid UTF-8).
    ``due_ms``: a throttled task's due time, the place it keeps in its key's line. The
    error's gist (its exception line) goes along for a queue's task histories."""
    base, cap, factor = policy.backoff.args()
    error = utf8_safe(error if isinstance(error, str) else str(error))
    gist = error_summary(error, 500) if error else ""
    return [
        task_id,
        token,
        outcome,
        delay_ms,
        error[:4000],
        policy.max_attempts,
        base,
        cap,
        factor,
        "" if due_ms is None else due_ms,
        gist,
    ]


@dataclass(frozen=True, slots=True)
class InfoReply:
    now_ms: int
    state: str  # '' when unknown
    score_ms: int | None
    attempts: int
    envelope: bytes | None
    error: str | None
    expires_ms: int | None
    last_event: bytes | None = None  # [H] of an unknown task: its history's last event


def parse_info(reply: Sequence[Any]) -> InfoReply:
    state = _str(reply[1])
    if not state:
        last = bytes(reply[7]) if len(reply) > 7 and reply[7] else None
        return InfoReply(int(reply[0]), "", None, 0, None, None, None, last)
    score = int(float(reply[2]))
    return InfoReply(
        now_ms=int(reply[0]),
        state=state,
        score_ms=score // 10,
        attempts=int(reply[3]),
        envelope=bytes(reply[4]) or None,
        error=_text(reply[5]) or None,
        expires_ms=int(float(reply[6])) if reply[6] else None,
    )


@dataclass(frozen=True, slots=True)
class StatsReply:
    """The stats script's reply (stats.lua): counts per state, times and counters."""

    now_ms: int
    delayed: int
    ready: int
    inflight: int
    dead: int
    overdue: int
    expired: int  # leases that ran out, not yet reclaimed (not counted in inflight)
    oldest_due_ms: int | None  # the due time of the oldest task waiting to be taken
    next_due_ms: int | None
    counters: dict[str, int]
    lateness: dict[float, int]  # bucket upper bound in seconds (last: math.inf) -> count
    lateness_sum: float  # seconds
    seen_ms: int | None  # when a consumer last fetched
    paused_until_ms: int | None = None  # [L] None: not paused; 0: until resumed
    limit_waiting: dict[str, int] = dataclasses.field(default_factory=dict)  # [L] "" = total
    limit_running: dict[str, int] = dataclasses.field(default_factory=dict)
    limit_throttled: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        """Tasks stored in any state."""
        return self.delayed + self.ready + self.inflight + self.expired + self.dead


# Fields of a counters hash that are states, not counts since the queue began: the last look,
# the history mirror, a pause, the limits' gauges and a retired sub-queue's mark.
_STATE_FIELDS: Final = ("seen_ms", "hist", "pause:until", "lim:waiting", "lim:running", "retired")


def lifetime_count(field: str) -> bool:
    """Whether a counters-hash field counts since the queue began (summed over its shards,
    carried into the new layout when a reshard retires a sub-queue)."""
    return field not in _STATE_FIELDS and not field.startswith(("limw:", "limr:"))


def parse_stats(reply: Sequence[Any]) -> StatsReply:
    # The counters hash follows the fixed fields; the fetch script keeps the lateness
    # histogram and the consumer's last look in it under reserved names.
    counters: dict[str, int] = {}
    lateness = dict.fromkeys((*(ms / 1000 for ms in LATENESS_BUCKETS_MS), math.inf), 0)
    lateness_sum_ms, seen_ms, paused_until_ms = 0, None, None
    waiting: dict[str, int] = {}
    running: dict[str, int] = {}
    throttled: dict[str, dict[str, int]] = {}
    for i in range(9, len(reply), 2):
        field, value = _text(reply[i]), int(reply[i + 1])
        if field == "seen_ms":
            seen_ms = value
        elif field == "hist":  # [H] the mirror of the history settings: no counter
            continue
        elif field == "pause:until":
            paused_until_ms = value
        elif field in ("lim:waiting", "lim:running"):  # [L] the totals, under key ""
            (waiting if field == "lim:waiting" else running)[""] = value
        elif field.startswith(("limw:", "limr:")):
            (waiting if field.startswith("limw:") else running)[field[5:]] = value
        elif field.startswith("limt:"):  # [L] limt:<reason>:<key>
            reason, _, key = field[5:].partition(":")
            throttled.setdefault(reason, {})[key] = value
        elif field == "late:sum":
            lateness_sum_ms = value
        elif field.startswith("late:"):
            bound = field[5:]
            lateness[math.inf if bound == "inf" else int(bound) / 1000] = value
        else:
            counters[field] = value
    now_ms, delayed, ready, inflight, dead, overdue, oldest, next_due = map(int, reply[:8])
    return StatsReply(
        expired=int(reply[8]) if len(reply) > 8 else 0,
        now_ms=now_ms,
        delayed=delayed,
        ready=ready,
        inflight=inflight,
        dead=dead,
        overdue=overdue,
        oldest_due_ms=None if oldest < 0 else oldest,
        next_due_ms=None if next_due < 0 else next_due,
        counters=counters,
        lateness=lateness,
        lateness_sum=lateness_sum_ms / 1000,
        seen_ms=seen_ms,
        paused_until_ms=paused_until_ms,
        limit_waiting=waiting,
        limit_running=running,
        limit_throttled=throttled,
    )


def stats_from_reply(name: str, reply: Sequence[Any]) -> Stats:
    """The :class:`Stats` of queue ``name`` from one reply of the ``stats`` script."""
    raw = parse_stats(reply)
    oldest = raw.oldest_due_ms
    return Stats(
        queue=name,
        delayed=raw.delayed,
        ready=raw.ready,
        inflight=raw.inflight,
        dead=raw.dead,
        overdue=raw.overdue,
        expired=raw.expired,
        oldest_overdue_age=0.0 if oldest is None else (raw.now_ms - oldest) / 1000,
        next_due_at=to_datetime(raw.next_due_ms),
        counters=raw.counters,
        lateness=raw.lateness,
        lateness_sum=raw.lateness_sum,
        consumer_seen_at=to_datetime(raw.seen_ms),
        paused=raw.paused_until_ms is not None,
        paused_until=to_datetime(raw.paused_until_ms or None),
        limit_waiting=raw.limit_waiting,
        limit_running=raw.limit_running,
        limit_throttled=raw.limit_throttled,
    )


class DeadRow(NamedTuple):
    """One dead-lettered task from the dead script (dead.lua)."""

    id: str
    dead_ms: int  # time of death, epoch ms
    attempts: int
    error: str | None
    envelope: bytes  # b"" when none is stored


def parse_dead(reply: Sequence[Any]) -> list[DeadRow]:
    return [
        DeadRow(
            _id(reply[i]),
            int(reply[i + 1]),
            int(reply[i + 2]),
            _text(reply[i + 3]) or None,
            bytes(reply[i + 4]),
        )
        for i in range(0, len(reply), 5)
    ]


class TaskRow(NamedTuple):
    """One task of a page from the tasks script (tasks.lua)."""

    id: str
    score_ms: int  # by state: due time, lease expiry or time of death (epoch ms)
    attempts: int
    envelope: bytes  # b"" when none is stored
    error: str | None
    expires_ms: int | None  # ttl deadline


def parse_tasks(reply: Sequence[Any]) -> list[TaskRow]:
    """The tasks of a page (the reply's first entry, the server's time, is not needed)."""
    return [
        TaskRow(
            _id(reply[i]),
            int(float(reply[i + 1])) // 10,  # score = ms * 10 + slot (see _lib.lua)
            int(reply[i + 2]),
            bytes(reply[i + 3]),
            _text(reply[i + 4]) or None,
            int(float(reply[i + 5])) if reply[i + 5] else None,
        )
        for i in range(1, len(reply), 6)
    ]


def parse_statuses(reply: Sequence[Any]) -> list[bool]:
    """One status per task, 1 or 0: the ack script's (acked, or the lease was lost) and the
    cancel script's (cancelled, or the task was not waiting)."""
    return [int(status) != 0 for status in reply]


parse_ack = parse_cancel = parse_statuses


class Rescheduled(NamedTuple):
    """The reschedule script's reply (reschedule.lua)."""

    moved: bool  # False: the task is not waiting
    ms: int  # its new due time when moved, else the server's time


def parse_reschedule(reply: Sequence[Any]) -> Rescheduled:
    return Rescheduled(int(reply[0]) == 1, int(reply[1]))


class Requeued(NamedTuple):
    """The requeue script's reply (requeue.lua)."""

    requeued: int
    examined: int  # dead tasks looked at; fewer than the limit: none left after them


def parse_requeue(reply: Sequence[Any]) -> Requeued:
    return Requeued(int(reply[0]), int(reply[1]))


def parse_purge(reply: Sequence[Any]) -> int:
    """Tasks deleted by one purge call (purge.lua); fewer than its limit: none are left."""
    return int(reply[0])


class NackStatus(enum.IntEnum):
    """The nack script's status (nack.lua)."""

    LEASE_LOST = 0
    SCHEDULED = 1  # to be delivered again
    DEAD = 2  # dead-lettered
    RESENT = 3  # this token already gave the task back: a resent call, done before


class Nacked(NamedTuple):
    """The nack script's reply: what became of the task, and when (epoch ms)."""

    status: NackStatus
    ms: int  # the new due time when scheduled again, else the server's time

    @property
    def held(self) -> bool:
        """The caller still held the lease: the give-back took effect (now or before)."""
        return self.status is not NackStatus.LEASE_LOST


def parse_nack(reply: Sequence[Any]) -> Nacked:
    return Nacked(NackStatus(int(reply[0])), int(reply[1]))


def parse_extend(reply: Any) -> int | None:
    """The lease's new expiry (epoch ms) from the extend script, None if the lease is lost."""
    expiry = int(reply)
    return None if expiry < 0 else expiry


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id(value: Any) -> str:
    """A task id from Redis: bytes that are not UTF-8 (written by another client) survive as
    lone surrogates, so that ``.encode("utf-8", "surrogateescape")`` gives them back."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _text(value: Any) -> str:
    """Text from Redis meant for reading (error texts): invalid UTF-8 shown as escapes."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
