"""A worker whose Redis never answered at the start stops with the reason: the command exits
non-zero (the workers themselves: _async/test_worker_start.py and its generated sync twin);
once connected, a worker rides out outages (tests/integration/test_faults.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

CLI = [sys.executable, "-m", "delayq.cli"]


def test_worker_command_exits_non_zero_with_the_reason(tmp_path) -> None:
    app = tmp_path / "tasks_app.py"
    app.write_text("def handle(task):\n    return None\n")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "worker", "tasks_app:handle", "-q", "w", "--redis", "redis://no-such-host.invalid"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    assert "no-such-host.invalid" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 20
