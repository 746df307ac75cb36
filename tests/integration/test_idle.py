"""An idle consumer costs Redis about one script call per safety interval, not per poll."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis

from ..conftest import BINARIES


@pytest.fixture
def private_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(BINARIES[0][1]).start()  # alone on it: its command counts are ours
    yield server
    server.stop()


def _fetches(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_repeated_timed_polls_with_nothing_due_look_once(private_server: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(private_server.url)
    with DelayQueue("idle", private_server.url, safety_interval=30) as q:
        q.offer("later", 3600)
        for _ in range(2):  # the listener's first connect is news too: allow it a look
            assert q.poll(timeout=0.1) is None
        before = _fetches(client)
        for _ in range(8):  # as a worker's fetch loop does while idle
            assert q.poll(timeout=0.1) is None
        assert _fetches(client) == before
        # A "look now" poll always looks, and an offer that is due at once ends the quiet.
        assert q.poll(timeout=0) is None
        assert _fetches(client) - before == 1
        producer = DelayQueue("idle", private_server.url)
        producer.offer("now", 0)
        task = q.poll(timeout=5)
        assert task is not None and task.payload == "now"
        producer.close()
    client.close()
