"""The interface every contestant of the peer benchmark implements (see bench/README.md).

A contestant knows how to enqueue :class:`Job` s into its queue library and how to start ONE
worker process whose handler records, on each task start, ``f"{i} {due} {time.time()}\\n"``
in a sink file. The harness (``bench/harness.py``) does the rest: Redis, timing, statistics.
"""

from __future__ import annotations

import json
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: repository root: worker processes run with this cwd and this on PYTHONPATH
ROOT = Path(__file__).resolve().parents[2]

#: size of the "pad" so that json.dumps(payload(job)) is about 100 bytes
PAD = 50


@dataclass(frozen=True)
class Job:
    i: int  # index; -1 = warm-up job
    due: float  # epoch seconds (time.time() clock) when it should run


def payload(job: Job) -> dict[str, Any]:
    """The job's payload: about 100 bytes as JSON."""
    return {"i": job.i, "due": job.due, "pad": "x" * PAD}


class Contestant(ABC):
    name: str  # "delayq", "delayq-async", "arq", "saq", "rq", "dramatiq", "celery", ...
    settings: str = "defaults"  # every setting changed from the peer's defaults, and why

    @abstractmethod
    def version(self) -> str:
        """Version of the peer library (and of its runtime when it matters)."""

    def unavailable(self) -> str | None:
        """Why this contestant cannot run here, or None."""
        return None

    @abstractmethod
    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        """Enqueue every job (delay = job.due - now at the time of the call).

        One call per job if not ``bulk``; the peer's bulk API if ``bulk`` (raise
        NotImplementedError if it has none). Return the seconds spent in the enqueue
        calls alone (connection setup excluded).
        """

    def preload(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        """Enqueue tasks a scenario needs in place but does not time (the burst's 50,000, the
        idle scenario's 100,000): with the bulk API of :meth:`preloader` if there is one."""
        helper = self.preloader() if bulk else None
        return (helper or self).enqueue(url, queue, jobs, bulk)

    def preloader(self) -> Contestant | None:
        """Another contestant that writes this one's Redis layout faster, for :meth:`preload`."""
        return None

    @abstractmethod
    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        """argv of ONE worker process at the peer's defaults.

        cwd = repo root, env has PYTHONPATH=repo root plus :meth:`worker_env`. Its handler, on
        each task START, appends ``f"{i} {due} {time.time()}\\n"`` to ``sink`` (opened once per
        process, append mode, flushed per line), then returns; with ``hold=True`` it records and
        then blocks (sleeps for an hour) so that the task stays held.
        """

    def worker_env(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# ---------------------------------------------------------------------------------------------
# Helpers for the worker side (the *_app.py handler modules).

ENV_URL = "BENCH_REDIS_URL"
ENV_QUEUE = "BENCH_QUEUE"
ENV_SINK = "BENCH_SINK"
ENV_HOLD = "BENCH_HOLD"

HOLD_SECONDS = 3600.0


def bench_env(url: str, queue: str, sink: str, hold: bool) -> dict[str, str]:
    """The BENCH_* variables a handler module reads with :class:`Sink`/:func:`from_env`."""
    return {ENV_URL: url, ENV_QUEUE: queue, ENV_SINK: sink, ENV_HOLD: "1" if hold else "0"}


def from_env() -> tuple[str, str, str, bool]:
    """(url, queue, sink, hold) from the BENCH_* environment variables."""
    return (
        os.environ[ENV_URL],
        os.environ.get(ENV_QUEUE, "bench"),
        os.environ[ENV_SINK],
        os.environ.get(ENV_HOLD, "0") == "1",
    )


class Sink:
    """The per-process sink file: ``record`` one line per task start, flushed per line."""

    def __init__(self, path: str, hold: bool = False) -> None:
        self.path = path
        self.hold = hold
        self._file: IO[str] | None = None

    def _open(self) -> IO[str]:
        if self._file is None:
            self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - held open for life
        return self._file

    def record(self, i: Any, due: Any) -> None:
        """Write the start line (call first thing in the handler); hold if asked."""
        now = time.time()
        f = self._open()
        f.write(f"{int(i)} {float(due)!r} {now!r}\n")
        f.flush()
        if self.hold:
            time.sleep(HOLD_SECONDS)

    async def arecord(self, i: Any, due: Any) -> None:
        """:meth:`record` for asyncio handlers: holds with ``asyncio.sleep``, not the loop."""
        import asyncio

        hold, self.hold = self.hold, False
        try:
            self.record(i, due)
        finally:
            self.hold = hold
        if hold:
            await asyncio.sleep(HOLD_SECONDS)

    def record_payload(self, data: Any) -> None:
        """:meth:`record` from a payload dict (or its JSON text/bytes)."""
        if isinstance(data, (bytes, str)):
            data = json.loads(data)
        self.record(data["i"], data["due"])


def python() -> str:
    """The interpreter worker processes run with (the benchmark venv's)."""
    return sys.executable


def with_bench_env(url: str, queue: str, sink: str, hold: bool, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` with the BENCH_* variables set (for peers' own worker CLIs,
    which cannot be told about the sink): ``python -m bench.peers._launch URL QUEUE SINK HOLD --
    argv...`` sets them and then execs ``argv``."""
    return [
        python(),
        "-m",
        "bench.peers._launch",
        url,
        queue,
        sink,
        "1" if hold else "0",
        "--",
        *argv,
    ]
