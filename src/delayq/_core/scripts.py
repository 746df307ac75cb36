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
    # fetch.lua and ack.lua without the optional subsystems (_plain.lua): the hot path of a
    # queue with no pause, limits, histories or schedules; nil when it has one.
    FETCH_PLAIN = "fetch:plain"
    ACK_PLAIN = "ack:plain"


PLAIN = {Op.FETCH: Op.FETCH_PLAIN, Op.ACK: Op.ACK_PLAIN}
"""The plain variant of each script that has one."""


@dataclass(frozen=True, slots=True)
class Script:
    """A script's full source (shared preamble included) and its SHA1."""

    op: Op
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files("delayq._core").joinpath("lua", f"{name}.lua").read_text("utf-8")


_FUNCTION = re.compile(r"^local function (\w+)", re.MULTILINE)


def _with_library(body: str, plain: bool = False) -> str:
    """``body`` preceded by the shared preamble, keeping only the library functions it uses
    (directly or through other library functions): each defined function costs every call.
    ``plain``: _plain.lua's stand-ins replace the library's functions of their names, in
    place, and the body runs only if plain_refused() finds none of the features."""
    header, blocks, calls = _library()
    if plain:
        stand_ins = _blocks(_read("_plain"))
        blocks = {name: stand_ins.get(name, block) for name, block in blocks.items()}
        blocks |= {name: block for name, block in stand_ins.items() if name not in blocks}
        body = "if plain_refused() then return false end\n" + body
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
    blocks = _blocks(lib)
    names = "|".join(sorted([*blocks, *_blocks(_read("_plain"))], key=len, reverse=True))
    return lib[: _FUNCTION.search(lib).start()], blocks, re.compile(rf"\b({names})\(")  # type: ignore[union-attr]


def _blocks(text: str) -> dict[str, str]:
    """``text``'s functions by name, in order, each with what follows it up to the next."""
    starts = [m.start() for m in _FUNCTION.finditer(text)]
    blocks = {}
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        block = text[start:end]
        blocks[_FUNCTION.match(block).group(1)] = block  # type: ignore[union-attr]
    return blocks


@cache
def script(op: Op) -> Script:
    """The loaded script of ``op`` (read from disk once per process)."""
    name, _, variant = op.value.partition(":")
    body = _read(name)
    source = body if "(standalone" in body else _with_library(body, plain=variant == "plain")
    return Script(op, source, hashlib.sha1(source.encode()).hexdigest())
