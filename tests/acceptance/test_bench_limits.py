"""bench.limits runs, at tiny size, as a user runs it (so the flow-control benchmark cannot rot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_limits_benchmark_runs_at_tiny_size() -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("REDIS_URL", None)  # the embedded server, never the machine's Redis
    done = subprocess.run(
        [sys.executable, "-m", "bench.limits", "--quick"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    for run in ("unthrottled", "rate"):
        assert result[run]["lost"] == 0 and result[run]["twice"] == 0, result
    assert result["rate"]["most_in_a_second"] <= 200 + 50, result
    assert result["keys"]["others_last_hand_out_s"] is not None
