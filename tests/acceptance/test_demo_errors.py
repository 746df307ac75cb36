"""The demo on a Redis it cannot use says so in one line (exit 2), without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://no-such-host.invalid:6379/0", "cannot reach Redis"),
        ("http://127.0.0.1:6379", "unsupported URL scheme"),
    ],
)
def test_demo_fails_in_one_line(url: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "delayq.demo", "--redis", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
