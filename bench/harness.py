"""Plumbing of the peer benchmark: worker processes, sink files, Redis counters, statistics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .peers.base import ROOT, Contestant, Job

WARMUP_TIMEOUT = 60.0


class BenchError(RuntimeError):
    """A run could not be carried out (worker died, did not start, ...)."""


# -- sinks -----------------------------------------------------------------------------------


@dataclass
class SinkReader:
    """Reads a sink file incrementally: lines ``i due started``."""

    path: Path
    rows: list[tuple[int, float, float]] = field(default_factory=list)
    _offset: int = 0
    _lines: int = 0
    _pending: bytes = b""

    def count_lines(self) -> int:
        """Number of complete lines so far (cheap: counts newlines of the new bytes)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self._lines
        end = chunk.rfind(b"\n") + 1
        if end:
            self._pending += chunk[:end]
            self._offset += end
            self._lines += chunk.count(b"\n", 0, end)
        return self._lines

    def read(self) -> list[tuple[int, float, float]]:
        """All complete lines so far, parsed."""
        self.count_lines()
        pending = self._pending
        self._pending = b""
        for line in pending.splitlines():
            parts = line.split()
            if len(parts) == 3:
                with contextlib.suppress(ValueError):
                    self.rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
        return self.rows

    def seen(self) -> set[int]:
        return {row[0] for row in self.read()}


# -- worker processes ------------------------------------------------------------------------


class WorkerProcess:
    """One worker process of a contestant, in its own session (so the whole tree can be
    SIGKILLed: rq forks a child per job, celery a pool)."""

    def __init__(
        self, contestant: Contestant, url: str, queue: str, sink: Path, hold: bool, logdir: Path
    ) -> None:
        self.contestant = contestant
        self.sink = sink
        self.log = logdir / f"{contestant.name}-{int(time.time() * 1000)}-worker.log"
        argv = contestant.worker_argv(url, queue, str(sink), hold)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.update(contestant.worker_env())
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the worker and everything it started (its process group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_worker(
    contestant: Contestant,
    url: str,
    queue: str,
    sink: Path,
    logdir: Path,
    *,
    hold: bool = False,
    warm: bool = True,
) -> WorkerProcess:
    """Start a worker; with ``warm``, return once it handled a warm-up job (i = -1)."""
    worker = WorkerProcess(contestant, url, queue, sink, hold, logdir)
    if not warm:
        return worker
    try:
        contestant.enqueue(url, queue, [Job(-1, time.time())], bulk=False)
        reader = SinkReader(sink)
        deadline = time.monotonic() + WARMUP_TIMEOUT
        while time.monotonic() < deadline:
            if -1 in reader.seen():
                worker.warm_s = time.time() - worker.started  # type: ignore[attr-defined]
                return worker
            if not worker.alive():
                raise BenchError(f"worker exited ({worker.proc.returncode}): {worker.log_tail()}")
            time.sleep(0.02)
        raise BenchError(f"worker not live after {WARMUP_TIMEOUT:.0f} s: {worker.log_tail()}")
    except BaseException:
        worker.kill()
        raise


# -- Redis counters --------------------------------------------------------------------------


class Counters:
    """INFO-based counters on one long-lived connection (its own commands are subtracted)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.client.ping()
        self.calls = 0

    def snapshot(self) -> dict[str, float]:
        stats = self.client.info("stats")
        cpu = self.client.info("cpu")
        self.calls += 2
        return {
            "commands": float(stats["total_commands_processed"]),
            "cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "at": time.time(),
            "calls": float(self.calls),
        }

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """Commands (minus the snapshots' own INFO calls) and CPU seconds between two."""
        # The "before" INFO calls count after their reply; the "after" ones before it.
        own = after["calls"] - before["calls"]
        return {
            "commands": after["commands"] - before["commands"] - own,
            "cpu_s": after["cpu"] - before["cpu"],
            "seconds": after["at"] - before["at"],
        }

    def address(self) -> str:
        """host:port of this connection as Redis sees it."""
        info = self.client.client_info()
        self.calls += 1
        return str(info["addr"])

    def close(self) -> None:
        self.client.close()


def process_tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of a process and its descendants, by pid."""
    import psutil

    out: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


# -- statistics ------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def verdict(rows: Iterable[tuple[int, float, float]], n: int) -> dict[str, Any]:
    """First start of each task 0..n-1: lateness list (ms), delivered, lost, duplicated."""
    first: dict[int, tuple[float, float]] = {}
    total = 0
    for i, due, started in rows:
        if i < 0:
            continue
        total += 1
        if i not in first:
            first[i] = (due, started)
    lateness = [(started - due) * 1000 for due, started in first.values()]
    return {
        "lateness_ms": lateness,
        "delivered": len(first),
        "lost": n - len([i for i in first if 0 <= i < n]),
        "duplicated": total - len(first),
        "early": sum(1 for x in lateness if x < 0),
        "last_start": max((s for _, s in first.values()), default=None),
    }


def lateness_summary(lateness: Sequence[float]) -> dict[str, float | None]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {
        "p50_ms": r(pct(lateness, 0.50)),
        "p90_ms": r(pct(lateness, 0.90)),
        "p99_ms": r(pct(lateness, 0.99)),
        "max_ms": r(max(lateness, default=None)),  # type: ignore[type-var]
    }


def sample(values: Sequence[float], points: int) -> list[float]:
    """Up to ``points`` values of a sorted copy, evenly spaced (for plots)."""
    ordered = sorted(values)
    if len(ordered) <= points:
        return [round(v, 3) for v in ordered]
    step = (len(ordered) - 1) / (points - 1)
    return [round(ordered[round(k * step)], 3) for k in range(points)]
