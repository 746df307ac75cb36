"""A worker of each front end whose Redis never answered at the start stops with the reason
(tests/integration/test_worker_start.py: the command exits non-zero)."""

from __future__ import annotations

import time

import pytest

from delayq import AsyncDelayQueue, AsyncWorker, RedisUnavailable
from delayq.embedded import EmbeddedRedis
from tests.conftest import BINARIES


def _dead_url() -> str:
    with EmbeddedRedis(BINARIES[0][1]) as server:
        return server.url  # stopped on exit: nothing listens there now


async def test_worker_that_never_reached_redis_raises(prefix: str) -> None:
    q = AsyncDelayQueue("w", _dead_url(), prefix=prefix, reconnect_timeout=0.5)

    async def handle(task: object) -> None:
        return None

    started = time.monotonic()
    try:
        with pytest.raises(RedisUnavailable, match="unreachable"):
            await AsyncWorker(q, handle).run()
        assert time.monotonic() - started < 5
    finally:
        await q.close()
