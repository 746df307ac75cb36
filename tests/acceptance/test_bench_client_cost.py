"""bench.client_cost runs, at tiny size, as a user runs it (the callgrind count of client
instructions per task in docs/benchmarks-core.md cannot rot)."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.acceptance.bench_run import run_bench


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_client_cost_benchmark_counts_instructions_per_task() -> None:
    done = run_bench("client_cost", "--tasks", "5,15", "--flavours", "sync", timeout=240)
    figures = re.fullmatch(r".+ sync: ([\d,]+) instructions/task\n", done.stdout)
    assert figures is not None, done.stdout
    assert int(figures.group(1).replace(",", "")) > 1000  # a take and an ack run Python code
