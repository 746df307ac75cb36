"""The plain-consumer benchmark (``python -m bench.consumer``, issue #12) at tiny size, so that
its harness cannot rot: every row runs, and none loses or repeats a task. Speeds are printed
by the benchmark, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.consumer import REDISSON_ROWS, ROWS, has_consume

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_consumer_benchmark_smoke(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)  # its own servers, never the machine's Redis
    argv = [sys.executable, "-m", "bench.consumer", "--smoke", "--out", str(tmp_path)]
    argv += ["--docs", str(tmp_path / "docs")]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((tmp_path / "consumer.json").read_text())
    expected = [row for row in ROWS if not row.endswith("consume") or has_consume(row)]
    assert results["rows"] == expected
    assert set(results["skipped"]) == set(ROWS) - set(expected)
    for row in expected:
        median = results["medians"][row]
        assert "error" not in median, (row, median)
        assert median["complete"] is True and median["delivered"] == results["sizes"]["tasks"]
        assert median["lost"] == 0 and median["duplicated"] == 0, (row, median)
        assert median["per_s"] > 0 and median["redis_commands_per_task"] > 0, (row, median)
        idle = results["idle"][row]
        assert isinstance(idle["commands_per_s"], int | float) and "error" not in idle, row
        assert f"| {row} |" in done.stdout  # the printed table has a line per row
    verdicts = results["verdicts"]
    assert verdicts["yardstick"] in ("redisson", "redisson-lean")
    assert set(verdicts["rows"]) == {row for row in expected if row not in REDISSON_ROWS}
    assert verdicts["rows"]["async-take"]["against"] == "async-redisson-lean"
    assert verdicts["rows"]["take"]["against"] == verdicts["yardstick"]
    page = (tmp_path / "docs" / "benchmarks-consumer.md").read_text()
    assert "| take |" in page and "yardstick" in page
