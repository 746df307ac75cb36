"""The peer benchmark (``python -m bench``) at tiny size, so that the harness cannot rot.

By default only delayq, delayq-async and arq run (see below). Runs in the benchmark venv
``.venv-bench`` (the peers pin redis-py 5.x): skipped when it is missing, unless
DELAYQ_REQUIRE_ALL_REDIS is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
SCENARIOS = {
    "enqueue_single": "per_s",
    "enqueue_bulk": "per_s",
    "steady": "p99_ms",
    "sparse": "p99_ms",
    "burst": "per_s",
    "idle": "commands_per_s",
    "crash": "held",
}


@pytest.mark.timeout(300)
def test_bench_smoke(tmp_path: Path) -> None:
    if not BENCH_PYTHON.exists():
        if os.environ.get("DELAYQ_REQUIRE_ALL_REDIS"):
            pytest.fail(f"{BENCH_PYTHON} is missing (make bench creates it)")
        pytest.skip(f"{BENCH_PYTHON} is missing (make bench creates it)")
    out, docs = tmp_path / "results", tmp_path / "docs"
    argv = [str(BENCH_PYTHON), "-m", "bench", "--smoke", "--out", str(out), "--docs", str(docs)]
    # Every contestant takes ~15 s even at tiny size (six worker starts, 1-s lateness spreads),
    # so by default delayq's two and one peer (an asyncio poller) run: < 90 s.
    # DELAYQ_BENCH_SMOKE_ALL=1 runs every available contestant (~3 min);
    # DELAYQ_BENCH_SMOKE_ONLY=a,b picks.
    only = os.environ.get("DELAYQ_BENCH_SMOKE_ONLY")
    if not only and not os.environ.get("DELAYQ_BENCH_SMOKE_ALL"):
        only = "delayq,delayq-async,arq"
    if only:
        argv += ["--only", only]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    sys.stdout.write(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stderr[-5000:]

    results = json.loads((out / "peers.json").read_text())
    for who in ("delayq", "delayq-async"):
        entry = results["contestants"][who]
        for label, field in SCENARIOS.items():
            median = entry[label]["median"]
            assert "error" not in median, (who, label, median)
            assert isinstance(median.get(field), int | float), (who, label, median)
            assert not median.get("lost"), (who, label, median)  # None or 0
            assert not median.get("duplicated"), (who, label, median)
        assert entry["burst"]["median"]["complete"] is True
        assert entry["crash"]["median"]["redelivered"] == entry["crash"]["median"]["held"]
    big = results["contestants"]["delayq-async"]["big"]["median"]
    assert big["complete"] is True and big["lost"] == 0 and big["duplicated"] == 0
    for name, entry in results["contestants"].items():  # every contestant ran every scenario
        assert set(SCENARIOS) <= set(entry), name
    text = (docs / "benchmarks.md").read_text()
    assert "## 4. Burst" in text and "delayq" in text
    assert (docs / "img" / "bench-lateness.png").stat().st_size > 1000
    assert (docs / "img" / "bench-burst.png").stat().st_size > 1000
    # the committed results and docs were not touched
    assert str(tmp_path) not in (ROOT / "docs" / "benchmarks.md").read_text()
