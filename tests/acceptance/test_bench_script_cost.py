"""bench.script_cost runs, at tiny size, as a user runs it (so the per-call cost measure of the
plain and full scripts cannot rot)."""

from __future__ import annotations

import re

from tests.acceptance.bench_run import run_bench


def test_script_cost_benchmark_runs_at_tiny_size() -> None:
    done = run_bench("script_cost", "--calls", "50", "--rounds", "1", timeout=120)
    rows = dict(re.findall(r"^(\w+ \w+)\s*: median\s+([\d.]+) us", done.stdout, re.MULTILINE))
    assert set(rows) == {"full fetch", "full ack", "plain fetch", "plain ack"}, done.stdout
    assert all(float(value) > 0 for value in rows.values())
