"""bench.limits runs, at tiny size, as a user runs it (so the flow-control benchmark cannot rot)."""

from __future__ import annotations

import json

import pytest

from tests.acceptance.bench_run import run_bench


@pytest.mark.slow
def test_limits_benchmark_runs_at_tiny_size() -> None:
    done = run_bench("limits", "--quick", timeout=240)
    result = json.loads(done.stdout)
    for run in ("unthrottled", "rate"):
        assert result[run]["lost"] == 0 and result[run]["twice"] == 0, result
    assert result["rate"]["most_in_a_second"] <= 200 + 50, result
    assert result["keys"]["others_last_hand_out_s"] is not None
