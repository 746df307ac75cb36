"""Fixtures and helpers of the fault tests (``pytest_plugins = ["tests.faults_support"]``):
private servers a test may kill, freeze and restart, and ways to look at a server.

Used by tests/integration/test_faults.py and tests/integration/_async/test_faults.py (with
the sync twin generated from it). The test modules import the helpers below before pytest
registers this module as a plugin, so pytest cannot rewrite its asserts (they are plain
checks anyway): PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq._core import protocol
from delayq.embedded import EmbeddedRedis
from tests.conftest import BINARIES


@pytest.fixture(params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def own_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    """A private AOF server this test may kill, freeze and restart (each Redis version)."""
    server = EmbeddedRedis(request.param, aof=True).start()
    yield server
    server.stop()  # SIGKILL works on a frozen server too


@pytest.fixture
def own_server7() -> Iterator[EmbeddedRedis]:
    """A private AOF server of the newest version only, where the version does not matter."""
    server = EmbeddedRedis(BINARIES[0][1], aof=True).start()
    yield server
    server.stop()


@pytest.fixture
def raw_factory() -> Iterator[Callable[[str], redis.Redis]]:
    """Plain clients for looking at a server (TIME, CLIENT LIST, PUBSUB); closed at the end."""
    made: list[redis.Redis] = []

    def make(url: str) -> redis.Redis:
        made.append(redis.Redis.from_url(url))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="delayq")
    return caplog


def logged(caplog: pytest.LogCaptureFixture, *parts: str) -> bool:
    """True once a delayq log record contains every one of ``parts``."""
    return any(
        all(p in r.getMessage() for p in parts) for r in caplog.records if r.name == "delayq"
    )


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def subscribers(client: redis.Redis, channel: str) -> int:
    [(_, count)] = client.pubsub_numsub(channel)
    return int(count)


def freeze(server: EmbeddedRedis) -> None:
    """SIGSTOP: the server keeps its sockets but answers nothing (a hung host)."""
    assert server._proc is not None
    os.kill(server._proc.pid, signal.SIGSTOP)


def thaw(server: EmbeddedRedis) -> None:
    if server._proc is not None and server._proc.poll() is None:
        os.kill(server._proc.pid, signal.SIGCONT)


def empty_counts(stats: Any) -> tuple[int, ...]:
    return (stats.delayed, stats.ready, stats.inflight, stats.dead, stats.overdue)


def hide_announcements(monkeypatch: pytest.MonkeyPatch, producer: Any, prefix: str) -> str:
    """Make ``producer``'s offer script publish on a channel nobody's queue listens to: the
    task is written exactly as usual, only the wake-up message goes astray."""
    elsewhere = f"{prefix}:nobody-listens"
    keys = list(producer.keys.all)
    assert keys[-1] == producer.keys.channel
    shard = producer._engine(producer.name)  # the unsharded queue's one shard
    monkeypatch.setattr(shard, "_key_list", (*keys[:-1], elsewhere))
    single = list(producer.keys.offer_one)
    assert single[-1] == producer.keys.channel
    monkeypatch.setattr(shard, "_offer_one_keys", (*single[:-1], elsewhere))
    return elsewhere


def messages(pubsub: Any, timeout: float = 1.0) -> list[tuple[str, bytes]]:
    """What a plain pub/sub connection hears within ``timeout``: (channel, data) pairs."""
    found = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if message is not None:
            found.append((message["channel"].decode(), message["data"]))
    return found


def skew_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Set this process's wall clock ``seconds`` off (time.time and time.time_ns)."""
    real_time, real_time_ns = time.time, time.time_ns
    # Ids made meanwhile carry the skewed time; forget it afterwards, or later tests' ids
    # would keep counting from there.
    monkeypatch.setattr(protocol, "_last_stamp", protocol._last_stamp)
    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(seconds * 1e9))
