"""The process's outage log policy (_core/outages.py), without a server: one warning per
Redis and cause however many parts report it, one info line at its end, nothing per retry."""

from __future__ import annotations

import logging

import pytest

from delayq._core.outages import Outages, cause_of, refused_for_now, where_of
from delayq.exceptions import RedisUnavailable, ServerError


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]


def test_many_parts_and_tries_are_one_warning_and_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="delayq")
    outages, url = Outages(), "redis://127.0.0.1:7000/0"
    runner, link, fetch = object(), object(), object()
    for _ in range(5):
        outages.lost(url, runner, ConnectionError("Connection refused"), "calls")
        outages.lost(url, link, TimeoutError("Timeout reading"), "pub/sub")
        outages.lost(url, fetch, RedisUnavailable("gone"), "fetch from orders")
    assert lines(caplog) == [
        (
            logging.WARNING,
            f"delayq: Redis at {url} unavailable (unreachable: Connection refused): calls "
            "failing, retrying; logged once until it answers",
        )
    ]
    outages.back(url, link)
    outages.back(url, runner)  # the outage is over: later parts log nothing
    outages.back(url, fetch)
    assert len(lines(caplog)) == 2
    level, text = lines(caplog)[1]
    assert level == logging.INFO and text.startswith(f"delayq: Redis at {url} available again")
    assert "(unreachable; 15 failed tries)" in text
    assert outages.under_way() == []


def test_each_redis_and_cause_is_its_own_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    outages, part = Outages(), object()
    outages.lost("redis://a:1/0", part, ConnectionError("refused"), "calls")
    outages.lost("redis://b:1/0", part, ConnectionError("refused"), "calls")
    outages.lost("redis://a:1/0", part, Exception("LOADING Redis is loading"), "calls")
    assert [level for level, _ in lines(caplog)] == [logging.WARNING] * 3
    assert outages.under_way() == [
        ("redis://a:1/0", "LOADING"), ("redis://a:1/0", "unreachable"),
        ("redis://b:1/0", "unreachable"),
    ]  # fmt: skip
    outages.back("redis://a:1/0", part)  # ends both of a's, not b's
    assert outages.under_way() == [("redis://b:1/0", "unreachable")]
    assert [level for level, _ in lines(caplog)][3:] == [logging.INFO] * 2


def test_a_part_that_saw_nothing_ends_nothing_and_a_closed_part_is_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    outages, url, seen, bystander = Outages(), "redis://h:1/0", object(), object()
    outages.lost(url, seen, ConnectionError("refused"), "calls")
    outages.back(url, bystander)
    assert outages.under_way() == [(url, "unreachable")]
    outages.forget(seen)
    assert outages.under_way() == [] and len(lines(caplog)) == 1  # no "available again"
    outages.lost(url, seen, ConnectionError("refused"), "calls")  # a new outage: logged again
    assert len(lines(caplog)) == 2


def test_causes_and_where_an_error_names() -> None:
    assert cause_of(ConnectionError("x")) == cause_of(TimeoutError("y")) == "unreachable"
    assert cause_of(Exception("READONLY You can't write against a read only replica.")) == (
        "READONLY"
    )
    assert cause_of(ServerError("Redis refused a delayq call: boom")) == "ServerError"
    memory = ServerError("Redis refused a delayq call: OOM command not allowed when used memory")
    assert cause_of(memory) == "OOM" and refused_for_now(memory)
    assert refused_for_now(ServerError("Redis refused a delayq call: BUSY Redis is busy"))
    assert not refused_for_now(ServerError("Redis refused a delayq call: WRONGTYPE Operation"))
    assert not refused_for_now(ServerError("Redis refused a delayq call: ERR user_script:3"))
    on_62 = "Error running script (call to f_0): @user_script:17: @user_script: 17: -OOM command"
    assert refused_for_now(ServerError(f"Redis refused a delayq call: {on_62}"))
    inner = RedisUnavailable("gone", where="redis://h:1/0")
    try:
        try:
            raise inner
        except RedisUnavailable as exc:
            raise RedisUnavailable(f"queue 'q': {exc}") from exc  # as a queue re-raises it
    except RedisUnavailable as outer:
        assert where_of(outer, "q") == "redis://h:1/0"
    assert where_of(ServerError("x"), "q") == "q"
