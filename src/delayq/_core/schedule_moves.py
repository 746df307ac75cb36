"""Carrying schedules across a reshard (schedule_move.lua), pure: the arguments and replies
of each side's step. The I/O is in ``_async/schedule_moves.py``.

A schedule belongs to the shard its name maps to in the queue's current layout. A reshard
takes each one out of the old side's chain in one step (a tombstone that keeps what it
carried, so the move can run again) and lands it on the new side with its cursor, version,
counters, cron times ahead, held fires and remembered requests: a time the old side accepted
is refused on the new one, so none fires twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from . import sharding
from .schedule_calls import TOMBSTONE_MS


class Taken(NamedTuple):
    """What the old side gave up: its state hash (raw, as stored), cron times ahead, fires
    held by the overlap policy, requests (request, stored reply, ms left), and how long a
    removed schedule's tombstone has left (0: it was live)."""

    state: dict[bytes, bytes]
    times: list[bytes]
    held: list[bytes]
    requests: list[tuple[bytes, bytes, int]]
    tombstone_ms: int

    @property
    def live(self) -> bool:
        return self.tombstone_ms == 0


class Landed(NamedTuple):
    status: int  # 0 it was there already, 1 landed live, 2 landed a tombstone
    version: int
    ahead: int  # cron times ahead on the new side


def home_of(schedule: str, current: Sequence[str]) -> str:
    """The (sub-)queue of ``current`` (a layout's names) that holds schedule ``schedule``:
    the same rule as ``q.schedules`` uses."""
    return current[sharding.shard_of(schedule, len(current))]


def take_args(name: str, target: str) -> list[Any]:
    return ["take", name, target, TOMBSTONE_MS]


def parse_take(reply: Sequence[Any]) -> Taken | None:
    """None: the old side had no such schedule (or tombstone)."""
    if int(reply[0]) == 0:
        return None
    flat, times, held, flat_requests, ttl_ms = reply[1], reply[2], reply[3], reply[4], reply[5]
    state = {_raw(flat[k]): _raw(flat[k + 1]) for k in range(0, len(flat), 2)}
    requests = [
        (_raw(flat_requests[k]), _raw(flat_requests[k + 1]), int(flat_requests[k + 2]))
        for k in range(0, len(flat_requests), 3)
    ]
    was_live = state.get(b"mv_live") == b"1"
    ttl = int(ttl_ms)
    tombstone_ms = 0 if was_live else (ttl if ttl > 0 else TOMBSTONE_MS)
    return Taken(state, [_raw(t) for t in times], [_raw(h) for h in held], requests, tombstone_ms)


def land_args(name: str, source: str, taken: Taken) -> list[Any]:
    args: list[Any] = ["land", name, source, len(taken.state)]
    for field, value in taken.state.items():
        args += [field, value]
    args += [len(taken.times), *taken.times, len(taken.held), *taken.held]
    args.append(len(taken.requests))
    for request, stored, left_ms in taken.requests:
        args += [request, stored, left_ms]
    args.append(taken.tombstone_ms)
    return args


def parse_land(reply: Sequence[Any]) -> Landed:
    return Landed(*(int(v) for v in reply))


def far_source(state: Mapping[str, Any]) -> str | None:
    """The old (sub-)queue whose fires a carried schedule still counts as running (its state
    as ``parse_info`` returns it), or None if there are none left."""
    far, source = state.get("far"), state.get("far_q")
    if far in (None, b"", "") or int(far) <= 0 or not source:
        return None
    return source.decode() if isinstance(source, bytes) else str(source)


def settle_args(name: str, tombstone: Sequence[Any]) -> list[Any]:
    """The settle call from the old side's tombstone as 'peek' returned it (a flat list; empty
    once it expired: nothing is alive there any more)."""
    state = {_raw(tombstone[k]): _raw(tombstone[k + 1]) for k in range(0, len(tombstone), 2)}

    def number(field: bytes) -> int:
        value = state.get(field)
        return int(value) if value not in (None, b"") else 0

    last_out = state.get(b"last_out", b"")
    return [
        "settle", name, number(b"live"), number(b"missed"), last_out, number(b"last_end"),
        number(b"last_ok"),
    ]  # fmt: skip


def parse_names(reply: Sequence[Any]) -> list[str]:
    """The schedules an old side holds to carry: the live ones, then removed ones' tombstones."""
    return [_raw(n).decode() for n in [*reply[0], *reply[1]]]


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
