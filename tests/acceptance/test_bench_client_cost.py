"""bench.client_cost runs, at tiny size, as a user runs it (the callgrind count of client
instructions per task in docs/benchmarks-core.md cannot rot)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_client_cost_benchmark_counts_instructions_per_task() -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("REDIS_URL", None)  # the embedded server, never the machine's Redis
    done = subprocess.run(
        [sys.executable, "-m", "bench.client_cost", "--tasks", "5,15", "--flavours", "sync"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    figures = re.fullmatch(r".+ sync: ([\d,]+) instructions/task\n", done.stdout)
    assert figures is not None, done.stdout
    assert int(figures.group(1).replace(",", "")) > 1000  # a take and an ack run Python code
