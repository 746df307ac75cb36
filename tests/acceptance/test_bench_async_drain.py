"""bench.async_drain runs, at tiny size, as a user runs it (the asyncio worker's per-task CPU
measure of docs/benchmarks-core.md cannot rot)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_async_drain_benchmark_runs_at_tiny_size() -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("REDIS_URL", None)  # the embedded server, never the machine's Redis
    done = subprocess.run(
        [sys.executable, "-m", "bench.async_drain", "500"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    figures = re.fullmatch(
        r"(\d+) tasks/s, µs/task: redis ([\d.]+), client ([\d.]+)\n", done.stdout
    )
    assert figures is not None, done.stdout
    assert all(float(value) > 0 for value in figures.groups())
