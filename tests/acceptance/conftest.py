"""Fixtures the CLI's acceptance tests share: the test's own server and prefix as CLI
options, and queues on them that are closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis


@pytest.fixture
def target(redis7_server: EmbeddedRedis, prefix: str) -> list[str]:
    """The connection options of the test's server and key prefix."""
    return ["--redis", redis7_server.url, "--prefix", prefix]


@pytest.fixture
def queue(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., DelayQueue]]:
    made: list[DelayQueue] = []

    def make(name: str, **options: Any) -> DelayQueue:
        q = DelayQueue(name, redis7_server.url, prefix=prefix, **options)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()
