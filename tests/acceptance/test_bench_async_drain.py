"""bench.async_drain runs, at tiny size, as a user runs it (the asyncio worker's per-task CPU
measure of docs/benchmarks-core.md cannot rot)."""

from __future__ import annotations

import re

from tests.acceptance.bench_run import run_bench


def test_async_drain_benchmark_runs_at_tiny_size() -> None:
    done = run_bench("async_drain", "500", timeout=120)
    figures = re.fullmatch(
        r"(\d+) tasks/s, µs/task: redis ([\d.]+), client ([\d.]+)\n", done.stdout
    )
    assert figures is not None, done.stdout
    assert all(float(value) > 0 for value in figures.groups())
