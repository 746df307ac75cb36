"""The history: every operation of every soak process, as Jepsen records them.

Each process appends JSON lines to a file of its own (``<dir>/history/<process>.jsonl``), one
event per line, written with one ``write`` so that a SIGKILL can cut at most the last line. An
operation is an ``invoke`` followed by its completion, ``ok``, ``fail`` (it certainly did not
happen) or ``unknown`` (it may have happened: a timeout, a lost connection), paired by the
process's operation number ``i``. ``info`` events stand alone: a fault starting or ending, a
sample of the server's clock, the end-of-run survey.

Times ``t`` are ``time.monotonic()`` seconds. CLOCK_MONOTONIC is one clock for every process
of the machine, and the soak runs clients with a jumped wall clock under libfaketime with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, so ``t`` orders events across processes in real time
whatever the wall clocks say. Server-side times (``due_ms``, ``delivered_ms``) are Redis's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, UNKNOWN, INFO = "invoke", "ok", "fail", "unknown", "info"
COMPLETIONS = (OK, FAIL, UNKNOWN)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the history."""

    process: str
    type: str  # invoke / ok / fail / unknown / info
    f: str  # the operation: offer, cancel, reschedule, fetch, ack, handled, outbox, fault, ...
    t: float  # time.monotonic() seconds
    i: int = 0  # the process's operation number, pairing an invoke with its completion
    value: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return json.dumps(
            {"p": self.process, "type": self.type, "f": self.f, "t": self.t, "i": self.i,
             "v": self.value},
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def parse(cls, line: str) -> Event:
        d = json.loads(line)
        return cls(d["p"], d["type"], d["f"], float(d["t"]), int(d.get("i", 0)), d.get("v", {}))


class Recorder:
    """Appends one process's events to its history file (thread-safe)."""

    def __init__(self, directory: str | os.PathLike[str], process: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.process = process
        self._fd = os.open(
            Path(directory) / f"{process}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def _write(self, event: Event) -> None:
        data = (event.line() + "\n").encode()
        with self._lock:
            os.write(self._fd, data)

    def invoke(self, f: str, **value: Any) -> int:
        """Record the start of an operation; returns its number for :meth:`complete`."""
        number = next(self._numbers)
        self._write(Event(self.process, INVOKE, f, time.monotonic(), number, value))
        return number

    def complete(self, number: int, f: str, kind: str, **value: Any) -> None:
        assert kind in COMPLETIONS, kind
        self._write(Event(self.process, kind, f, time.monotonic(), number, value))

    def info(self, f: str, t: float | None = None, **value: Any) -> None:
        self._write(Event(self.process, INFO, f, time.monotonic() if t is None else t, 0, value))

    @contextlib.contextmanager
    def operation(self, f: str, **value: Any) -> Iterator[dict[str, Any]]:
        """``with rec.operation("cancel", id=x) as out: out["cancelled"] = q.cancel(x)``:
        ok with ``out`` when the block returns; fail or unknown (by :func:`classify`) when
        it raises, and the exception goes on."""
        number = self.invoke(f, **value)
        out: dict[str, Any] = {}
        try:
            yield out
        except BaseException as exc:
            self.complete(number, f, classify(exc), error=f"{type(exc).__name__}: {exc}"[:200])
            raise
        self.complete(number, f, OK, **out)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def classify(exc: BaseException) -> str:
    """fail if the operation certainly did not take effect, else unknown. delayq refuses bad
    input before writing, and a reply-carrying error (LeaseLost, a refused write such as
    OOM under noeviction) means the script did not run or wrote nothing; a lost connection or
    a timeout leaves it open."""
    from delayq import InvalidTaskError, LeaseLost, ServerError

    if isinstance(exc, (LeaseLost, InvalidTaskError)):
        return FAIL
    if isinstance(exc, ServerError) and "OOM" in str(exc):
        return FAIL
    return UNKNOWN


def load(directory: str | os.PathLike[str]) -> list[Event]:
    """Every event of every history file in ``directory``, in time order. A line cut by a
    SIGKILL (the last of its file) is skipped."""
    events: list[Event] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        events.extend(_parse_lines(path.read_text().splitlines()))
    events.sort(key=lambda e: e.t)
    return events


def _parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            yield Event.parse(line)
