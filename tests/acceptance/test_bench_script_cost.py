"""bench.script_cost runs, at tiny size, as a user runs it (so the per-call cost measure of the
plain and full scripts cannot rot)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_script_cost_benchmark_runs_at_tiny_size() -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("REDIS_URL", None)  # the embedded server, never the machine's Redis
    done = subprocess.run(
        [sys.executable, "-m", "bench.script_cost", "--calls", "50", "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dict(re.findall(r"^(\w+ \w+)\s*: median\s+([\d.]+) us", done.stdout, re.MULTILINE))
    assert set(rows) == {"full fetch", "full ack", "plain fetch", "plain ack"}, done.stdout
    assert all(float(value) > 0 for value in rows.values())
