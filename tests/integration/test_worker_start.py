"""A worker whose Redis never answered at the start stops with the reason (the command exits
non-zero); once connected, a worker rides out outages (tests/integration/test_faults.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, RedisUnavailable, Worker
from delayq.embedded import EmbeddedRedis

from ..conftest import BINARIES

CLI = [sys.executable, "-m", "delayq.cli"]


def _dead_url() -> str:
    with EmbeddedRedis(BINARIES[0][1]) as server:
        return server.url  # stopped on exit: nothing listens there now


def test_thread_worker_that_never_reached_redis_raises(prefix: str) -> None:
    q = DelayQueue("w", _dead_url(), prefix=prefix, reconnect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="unreachable"):
        Worker(q, lambda task: None).run()
    assert time.monotonic() - started < 5
    q.close()


async def test_async_worker_that_never_reached_redis_raises(prefix: str) -> None:
    q = AsyncDelayQueue("w", _dead_url(), prefix=prefix, reconnect_timeout=0.5)

    async def handle(task: object) -> None:
        return None

    with pytest.raises(RedisUnavailable):
        await AsyncWorker(q, handle).run()
    await q.close()


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
