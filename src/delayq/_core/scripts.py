"""The Lua scripts, loaded once from package data and run by SHA."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources


class Op(StrEnum):
    """One Lua script per operation; the value is the file name without ``.lua``."""

    OFFER = "offer"
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


@dataclass(frozen=True, slots=True)
class Script:
    """A script's full source (shared preamble included) and its SHA1."""

    op: Op
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files("delayq._core").joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def script(op: Op) -> Script:
    """The loaded script of ``op`` (read from disk once per process)."""
    source = _read("_lib") + "\n" + _read(op.value)
    return Script(op, source, hashlib.sha1(source.encode()).hexdigest())
