"""Helpers for tests: waiting on conditions instead of sleeping."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from delayq._core.scripts import PLAIN, Op, script
from delayq.embedded import EmbeddedRedis


def shas(op: Op) -> frozenset[str]:
    """The SHAs a queue may send for ``op``: its script's and its plain variant's."""
    return frozenset(script(variant).sha for variant in (op, PLAIN.get(op, op)))


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def delayq_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("delayq:")]


@contextlib.contextmanager
def busy_script(server: EmbeddedRedis) -> Iterator[None]:
    """A script that spins until it is killed: every other call meanwhile gets BUSY."""
    blocker = redis.Redis.from_url(server.url)
    blocker.config_set("lua-time-limit", 100)  # BUSY after 100 ms (busy-reply-threshold)

    def spin() -> None:
        with contextlib.suppress(redis.RedisError):
            blocker.eval("while true do end", 0)

    spinning = threading.Thread(target=spin, daemon=True)
    spinning.start()
    killer = redis.Redis.from_url(server.url)
    try:
        wait_until(lambda: _answers_busy(killer), 10)
        yield
    finally:
        wait_until(lambda: _killed(killer), 10)
        spinning.join(10)
        killer.close()
        blocker.close()


def _answers_busy(client: redis.Redis) -> bool:
    try:
        client.get("delayq-test-probe")
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


def _killed(client: redis.Redis) -> bool:
    with contextlib.suppress(redis.ResponseError):
        client.script_kill()
    return not _answers_busy(client)
