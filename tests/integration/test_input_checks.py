"""Bad input is refused at once, naming the parameter: a bool is not a count, a timedelta is a
duration, and an argument redis-py cannot send is no Redis outage."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from delayq import ConfigError, DelayQueue, InvalidTaskError, Worker


def test_a_bool_is_not_a_count_of_tasks(make_queue: Callable[..., DelayQueue]) -> None:
    q = make_queue(create=True)
    for call, what in (
        (lambda: q.poll_many(True), "max_tasks"),
        (lambda: q.dead(True), "limit"),
        (lambda: q.dead(10, False), "offset"),
        (lambda: q.tasks("ready", True), "limit"),
    ):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=what):
            call()
        assert time.monotonic() - started < 1.0  # refused, not retried as an outage


def test_an_argument_redis_py_cannot_send_is_refused_not_retried(
    make_queue: Callable[..., DelayQueue],
) -> None:
    """redis-py's DataError ("invalid input") is the caller's, not a lost connection: before,
    it was retried for the whole reconnect timeout and reported as Redis unreachable."""
    q = make_queue(create=True)
    runner: Any = q._shared.runner
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cannot send"):
        runner.command("SET", f"{q.name}:probe", True)
    assert time.monotonic() - started < 1.0


def test_options_refuse_a_bool_as_a_number(
    make_queue: Callable[..., DelayQueue], redis_url: str, prefix: str
) -> None:
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        DelayQueue("q", redis_url, prefix=prefix, max_payload_bytes=True)
    q = make_queue(create=True)
    for option in ("concurrency", "prefetch"):
        with pytest.raises(ConfigError, match=option):
            Worker(q, lambda task: None, **{option: True})


def test_a_header_that_is_not_utf8_is_named(make_queue: Callable[..., DelayQueue]) -> None:
    q = make_queue(create=True)
    with pytest.raises(InvalidTaskError, match="headers"):
        q.offer({"ok": 1}, headers={"trace": "bad\ud800"})
    with pytest.raises(InvalidTaskError, match="headers"):
        q.offer({"ok": 1}, headers={"bad\ud800": "x"})
    assert q.stats().total == 0


def test_the_relays_waits_take_a_timedelta() -> None:
    from delayq.outbox import AsyncRelay

    relay = AsyncRelay(
        "postgresql://u@127.0.0.1:1/db",
        sweep_interval=timedelta(seconds=2),
        max_backoff=timedelta(milliseconds=1500),
    )
    assert relay._sweep_s == 2.0 and relay._outage._longest == 1.5
    with pytest.raises(ConfigError, match="max_backoff must be at most 3600"):
        AsyncRelay("postgresql://u@127.0.0.1:1/db", max_backoff=timedelta(hours=2))
