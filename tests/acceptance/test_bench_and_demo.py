"""The benchmark harness and the demo, run as a user runs them (subprocesses, tiny sizes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 180) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)  # the embedded server, never the machine's Redis
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_core_benchmark_harness_runs_at_tiny_size() -> None:
    out = run("-m", "bench.core", "--quick")
    for scenario in ("offer_vs_zadd", "offer_many", "memory", "steady", "sparse", "drain_sync",
                     "drain_async"):  # fmt: skip
        assert f"{scenario}:" in out
    counts = re.findall(r"'(?:lost|duplicated|early)': (\d+)", out)
    assert counts and all(n == "0" for n in counts), out


@pytest.mark.slow
def test_demo_closes_every_unpaid_order_once() -> None:
    out = run("-m", "delayq.demo", "--orders", "60", "--spread", "1")
    assert "closed twice" in out and "OK" in out and "MISMATCH" not in out


def test_close_orders_example_runs() -> None:
    out = run("examples/close_orders.py")
    assert "closed order 1 (attempt 1" in out
    assert "closed order 2 (attempt 3" in out  # two Retry() before it succeeded
    assert "closed order 3" not in out and "dead-lettered" in out and "fraud" in out
