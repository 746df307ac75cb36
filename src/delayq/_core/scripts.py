"""The Lua scripts, loaded once from package data and run by SHA."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources


class Op(StrEnum):
    """One Lua script per operation; the value is the file name without ``.lua``."""

    OFFER = "offer"
    OFFER_ONE = "offer_one"
    FETCH = "fetch"
    ACK = "ack"
    NACK = "nack"
    EXTEND = "extend"
    CANCEL = "cancel"
    RESCHEDULE = "reschedule"
    INFO = "info"
    STATS = "stats"
    DEAD = "dead"
    REQUEUE = "requeue"
    BURY = "bury"
    TASKS = "tasks"
    PURGE = "purge"
    # the way off Redisson's RDelayedQueue (delayq.redisson)
    REDISSON_OFFER = "redisson_offer"
    REDISSON_MOVE = "redisson_move"
    REDISSON_CLAIM = "redisson_claim"
    REDISSON_LAND = "redisson_land"
    REDISSON_RELEASE = "redisson_release"
    SETTLE = "settle"  # the outbox relay's receipts (settle.lua)
    SCHEDULE_UPSERT = "schedule_upsert"
    SCHEDULE_REFILL = "schedule_refill"
    SCHEDULE_CONTROL = "schedule_control"
    SCHEDULE_INFO = "schedule_info"
    SCHEDULE_MOVE = "schedule_move"  # a reshard carries schedules to their new shard
    LIMIT_PAUSE = "limit_pause"  # [L] flow control
    LIMIT_ADMIN = "limit_admin"  # [L]
    HISTORY = "history"  # [H] task history settings


@dataclass(frozen=True, slots=True)
class Script:
    """A script's full source (shared preamble included) and its SHA1."""

    op: Op
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files("delayq._core").joinpath("lua", f"{name}.lua").read_text("utf-8")


_FUNCTION = re.compile(r"^local function (\w+)", re.MULTILINE)


def _with_library(body: str) -> str:
    """``body`` preceded by the shared preamble, keeping only the library functions it uses
    (directly or through other library functions): each defined function costs every call."""
    header, blocks, calls = _library()
    wanted: set[str] = set()
    pending = [body]
    while pending:
        for name in calls.findall(pending.pop()):
            if name not in wanted:
                wanted.add(name)
                pending.append(blocks[name])
    kept = "".join(block for name, block in blocks.items() if name in wanted)
    return header + kept + "\n" + body


@cache
def _library() -> tuple[str, dict[str, str], re.Pattern[str]]:
    """The preamble's header, its functions' blocks by name (in order), and one pattern that
    finds calls of any of them (one scan per text, not one per function)."""
    lib = _read("_lib")
    starts = [m.start() for m in _FUNCTION.finditer(lib)]
    blocks = {}
    for start, end in zip(starts, [*starts[1:], len(lib)], strict=True):
        block = lib[start:end]
        blocks[_FUNCTION.match(block).group(1)] = block  # type: ignore[union-attr]
    names = "|".join(sorted(blocks, key=len, reverse=True))
    return lib[: starts[0]], blocks, re.compile(rf"\b({names})\(")


@cache
def script(op: Op) -> Script:
    """The loaded script of ``op`` (read from disk once per process)."""
    body = _read(op.value)
    source = body if "(standalone" in body else _with_library(body)
    return Script(op, source, hashlib.sha1(source.encode()).hexdigest())
