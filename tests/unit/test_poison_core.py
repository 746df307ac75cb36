"""The pure parts of issue #14: error texts that always encode, replies with ids that are not
UTF-8, and the supervision bookkeeping of worker loops (on a fake clock)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from delayq import WorkerFailed
from delayq._core import protocol
from delayq._core.handling import Counters, Reject, Retry, Verdict, describe, outcome_of
from delayq._core.models import Backoff
from delayq._workers.common import LoopSupervisor, RestartPolicy


def test_describe_always_encodes_as_utf8() -> None:
    try:
        raise RuntimeError("bad \udcff name")
    except RuntimeError as exc:
        text = describe(exc)
    text.encode("utf-8")
    assert "RuntimeError: bad \\udcff name" in text


def test_describe_survives_an_exception_whose_str_raises() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise ValueError("no text for you")

    text = describe(Weird())
    assert "Weird" in text


def test_retry_and_reject_reasons_of_any_kind_become_text() -> None:
    assert outcome_of(Reject("no \udcfe"), 1, 3).error == "rejected: no \\udcfe"
    assert outcome_of(Retry(reason=42), 1, 3).error == "42"  # type: ignore[arg-type]
    retry = outcome_of(Retry(delay=-5), 1, 3)
    assert retry.verdict is Verdict.RETRY and retry.delay is None  # the backoff instead
    assert "Retry delay ignored" in retry.error


def test_nack_args_make_any_error_text_valid_utf8() -> None:
    policy = protocol.Policy(1000, 3, Backoff())
    args = protocol.nack_args(policy, b"\xff\xfe", "tok", "retry", -1, "x\udcff" * 3000)
    assert args[0] == b"\xff\xfe"  # a raw id goes out as the bytes Redis holds
    error = args[4]
    assert len(error) == 4000 and error.startswith("x\\udcff")
    error.encode("utf-8")


def test_fetch_reply_with_an_id_that_is_not_utf8() -> None:
    reply: list[Any] = [1_700_000_000_000_000, -1, b"", b"\xff\xfe", b"{}", 1, 5, 9, b"n-1"]
    (raw,) = protocol.parse_fetch(reply).tasks
    assert not raw.id_is_utf8 and raw.id_bytes == b"\xff\xfe"
    (ok,) = protocol.parse_fetch([0, -1, b"", b"abc", b"{}", 1, 5, 9, b"n-1"]).tasks
    assert ok.id_is_utf8 and ok.id == "abc" and ok.id_bytes == b"abc"


def test_dead_and_info_replies_with_bytes_that_are_not_utf8() -> None:
    ((task_id, _, _, error, _),) = protocol.parse_dead([b"\xff", 10, 1, b"bad \xfe", b"{}"])
    assert task_id.encode("utf-8", "surrogateescape") == b"\xff"
    assert error == "bad \\xfe"
    info = protocol.parse_info([1, b"dead", b"10", 1, b"{}", b"err \xff", b""])
    assert info.error == "err \\xff"


def test_a_loop_is_restarted_with_growing_backoff_then_given_up_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="delayq.worker")
    counters = Counters()
    policy = RestartPolicy(max_deaths=3, window_s=10, first_backoff_s=0.1, max_backoff_s=0.15)
    supervisor = LoopSupervisor(counters, policy)
    boom = RuntimeError("boom \x1b[31m")
    assert supervisor.died("fetch loop of q", boom, now=0.0) == 0.1
    assert supervisor.died("fetch loop of q", boom, now=1.0) == 0.15  # capped
    assert supervisor.died("ack loop", boom, now=1.5) == 0.1  # loops are counted apart
    supervisor.raise_if_failed()  # not failed yet
    assert supervisor.died("fetch loop of q", boom, now=2.0) is None
    assert counters.loop_restarts == 3 and counters.internal_errors == 4
    assert supervisor.failure is not None
    assert supervisor.failure.startswith("the fetch loop of q died 3 times within 10s")
    assert "\x1b" not in supervisor.failure and "\\x1b[31m" in supervisor.failure
    with pytest.raises(WorkerFailed, match="fetch loop of q died 3 times"):
        supervisor.raise_if_failed()
    assert all("\x1b" not in r.getMessage() for r in caplog.records)


def test_deaths_outside_the_window_are_forgotten() -> None:
    supervisor = LoopSupervisor(Counters(), RestartPolicy(max_deaths=2, window_s=10))
    for minute in range(10):  # one death a minute, for ten minutes: always restarted
        assert supervisor.died("run loop of q", RuntimeError("x"), now=minute * 60.0) is not None
    assert supervisor.failure is None
