"""Contestants that run in a venv of their own, ``.venv-bench-NAME`` (Makefile).

docket, streaq and taskiq pin Redis clients (redis-py >= 6 or 8, coredis) that cannot share
``.venv-bench`` with the older peers' redis-py 5.x. The harness runs in ``.venv-bench``, so such
a contestant does its enqueueing in a subprocess, ``VENV/bin/python -m bench.peers.NAME_app
enqueue URL QUEUE 0|1``, as bullmq_node.py does with Node: the jobs go in as JSON on stdin, and
the last line of stdout says how many were enqueued and the seconds spent in the enqueue calls
alone (the interpreter's start, imports and connecting are not counted). Its worker runs with the
same python.

This module is imported on both sides, so it needs nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from .base import ROOT, Contestant, Job, bench_env, payload

#: an ``enqueue`` of the app side: (url, queue, jobs, bulk) -> seconds spent in the calls
Enqueue = Callable[[str, str, list[Job], bool], Awaitable[float]]


class OwnVenvContestant(Contestant):
    """A contestant whose library lives in ``.venv-bench-{venv}``; ``app`` is its handler
    module (``bench.peers.NAME_app``), which also serves the ``enqueue`` command."""

    venv: str  # "docket": .venv-bench-docket
    app: str  # "bench.peers.docket_app"
    dists: tuple[str, ...]  # distributions whose versions version() reports
    has_bulk: bool = True

    @property
    def venv_dir(self) -> Path:
        return ROOT / f".venv-bench-{self.venv}"

    def python(self) -> str:
        return str(self.venv_dir / "bin" / "python")

    def script(self, name: str) -> str:
        """A console script of the venv (the peer's own CLI)."""
        return str(self.venv_dir / "bin" / name)

    def unavailable(self) -> str | None:
        if not (self.venv_dir / ".installed").exists():
            return f"{self.venv_dir.name} missing: run `make {self.venv_dir.name}/.installed`"
        return None

    def version(self) -> str:
        code = (
            "import importlib.metadata as m, sys; "
            "print(', '.join(f'{d} {m.version(d)}' for d in sys.argv[1:]))"
        )
        out = subprocess.run(
            [self.python(), "-c", code, *self.dists], capture_output=True, text=True, timeout=60
        )
        return out.stdout.strip() or f"? ({out.stderr.strip()[-300:]})"

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk and not self.has_bulk:
            raise NotImplementedError(f"{self.name} has no bulk enqueue")
        argv = [self.python(), "-m", self.app, "enqueue", url, queue, "1" if bulk else "0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), **bench_env(url, queue, os.devnull, False)}
        data = json.dumps([payload(j) for j in jobs])
        proc = subprocess.run(argv, input=data, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{self.app} enqueue exited {proc.returncode}: {proc.stderr[-1500:]}"
            )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if result["n"] != len(jobs):
            raise RuntimeError(f"{self.app} enqueued {result['n']} of {len(jobs)} jobs")
        return float(result["seconds"])


# -- the app side (runs in the peer's venv) ----------------------------------------------------


def serve(enqueue: Enqueue, commands: dict[str, Callable[[list[str]], None]] | None = None) -> None:
    """``python -m bench.peers.NAME_app enqueue URL QUEUE 0|1`` (jobs as JSON on stdin), or one
    of the app's own ``commands`` (given the remaining arguments)."""
    import asyncio

    args = sys.argv[1:]
    if args[:1] == ["enqueue"] and len(args) == 4:
        _, url, queue, bulk = args
        jobs = [Job(int(d["i"]), float(d["due"])) for d in json.load(sys.stdin)]
        seconds = asyncio.run(enqueue(url, queue, jobs, bulk == "1"))
        print(json.dumps({"n": len(jobs), "seconds": seconds}), flush=True)
    elif args and commands and args[0] in commands:
        commands[args[0]](args[1:])
    else:
        names = " | ".join(["enqueue URL QUEUE 0|1", *(commands or {})])
        raise SystemExit(f"usage: python -m bench.peers.NAME_app {names}")


def run_together(argvs: list[list[str]]) -> None:
    """Run several processes as one worker (taskiq's worker and its scheduler): they share this
    process's group, so the harness's SIGKILL of the group ends them all; if one exits, the
    others are stopped and this exits with its code."""
    procs = [subprocess.Popen(argv) for argv in argvs]

    def stop(signum: int, frame: object) -> None:
        for p in procs:
            p.terminate()

    signal.signal(signal.SIGTERM, stop)
    while True:
        for p in procs:
            code = p.poll()
            if code is not None:
                for other in procs:
                    if other.poll() is None:
                        other.kill()
                raise SystemExit(code)
        time.sleep(0.2)
