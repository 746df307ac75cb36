"""Task history's pure parts (delayq._core.history): settings, the stored events' format, what
get() makes of a task's last event. No Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayq import ConfigError, HistoryKind, HistorySettings, TaskState
from delayq._core import history, protocol
from delayq._core.models import HELD_STATES
from delayq._core.options import QueueOptions


def test_settings_defaults_and_units() -> None:
    s = HistorySettings()
    assert (s.retention, s.max_events, s.max_detail_bytes) == (timedelta(days=1), 50, 200)
    assert history.set_args(s) == ["set", 86_400_000, 50, 200]
    assert HistorySettings.of(90).retention == timedelta(seconds=90)
    assert HistorySettings.of(0.0015).retention_ms == 2  # rounded up to whole ms
    assert HistorySettings(5.0).retention == timedelta(seconds=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"retention": 0}, "> 0"),
        ({"retention": -1}, "> 0"),
        ({"retention": timedelta(days=31)}, "more than 30 days"),
        ({"retention": "1d"}, "seconds"),
        ({"max_events": 2}, "max_events"),
        ({"max_events": 1001}, "max_events"),
        ({"max_events": True}, "max_events"),
        ({"max_detail_bytes": 15}, "max_detail_bytes"),
        ({"max_detail_bytes": 4001}, "max_detail_bytes"),
        ({"max_detail_bytes": 200.0}, "max_detail_bytes"),
    ],
)
def test_absurd_settings_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        HistorySettings.of(**kwargs)  # type: ignore[arg-type]


def test_the_queue_option() -> None:
    assert QueueOptions.of().history is None  # as Redis has it
    assert QueueOptions.of(history=False).history is False
    assert QueueOptions.of(history=True).history == HistorySettings()
    assert QueueOptions.of(history=timedelta(hours=2)).history == HistorySettings.of(7200)
    assert QueueOptions.of(history=60).history == HistorySettings.of(60)
    custom = HistorySettings.of(60, max_events=5)
    assert QueueOptions.of(history=custom).history is custom
    for bad in ("1d", 0, [1]):
        with pytest.raises(ConfigError, match="history"):
            QueueOptions.of(history=bad)  # type: ignore[arg-type]


def test_settings_reply() -> None:
    assert history.parse_settings([]) is None
    assert history.parse_settings([b"60000", b"7", b"100"]) == HistorySettings.of(60, 7, 100)


def test_events_parse_with_details_holding_bars() -> None:
    events = history.parse_history(
        [
            b"1700000000000|offered|0|by web-1/42, due in 30m",
            b"1700000000005|delivered|1|to worker/7, 5ms late",
            b"1700000000009|retried|1|KeyError: 'a|b'",
            "1700000000010|trimmed|0|12",
            b"1700000000011|acked|2|",
        ]
    )
    assert [e.kind for e in events] == ["offered", "delivered", "retried", "trimmed", "acked"]
    assert events[0].kind is HistoryKind.OFFERED
    assert events[0].at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert events[1].attempt == 1 and events[1].detail == "to worker/7, 5ms late"
    assert events[2].detail == "KeyError: 'a|b'"  # split at the first three bars only
    assert events[3].detail == "12 events dropped here (max_events)"
    assert events[4].attempt == 2 and events[4].detail == ""


def test_entries_written_badly_or_by_a_newer_version_still_read() -> None:
    newer = history.parse_event(b"1700000000000|paused|0|by an operator")
    assert newer.kind == "paused" and newer.detail == "by an operator"
    for bad in (b"garbage", b"x|acked|1|", b"1|acked|one|", b"\xff\xfe|\x1b[31m"):
        event = history.parse_event(bad)
        assert event.kind == "unreadable" and "\x1b" not in event.detail
        assert event.at == datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("last", "state"),
    [
        ("acked", TaskState.DONE),
        ("delivered", TaskState.DONE),  # at-most-once: taken is done
        ("cancelled", TaskState.CANCELLED),
        ("expired", TaskState.CANCELLED),
        ("purged", TaskState.CANCELLED),
    ],
)
def test_an_ended_task_is_done_or_cancelled(last: str, state: TaskState) -> None:
    info = history.ended_info("t1", f"1700000000000|{last}|3|".encode())
    assert info is not None
    assert (info.id, info.state, info.attempts, info.outcome) == ("t1", state, 3, last)
    assert info.ended_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert info.payload is None and info.due_at is None


@pytest.mark.parametrize("last", ["offered", "retried", "dead-lettered", "trimmed", "bad"])
def test_a_history_that_does_not_end_tells_nothing(last: str) -> None:
    assert history.ended_info("t1", f"1700000000000|{last}|1|x") is None


def test_ended_states_are_not_held_states() -> None:
    assert TaskState.DONE not in HELD_STATES and TaskState.CANCELLED not in HELD_STATES
    assert [s.value for s in HELD_STATES] == ["delayed", "ready", "inflight", "expired", "dead"]


def test_origin_is_host_and_pid_and_follows_a_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import socket

    assert history.origin() == f"{socket.gethostname()}/{os.getpid()}"
    monkeypatch.setattr(os, "getpid", lambda: 424242)
    assert history.origin().endswith("/424242")
    monkeypatch.setattr(socket, "gethostname", lambda: "evil|\x1bhost")
    monkeypatch.setattr(os, "getpid", lambda: 434343)
    assert history.origin() == "evil/\\x1bhost/434343"  # safe to show, one field


def test_the_scripts_get_who_is_acting() -> None:
    from delayq import Backoff
    from delayq._core.models import DedupMode

    spec = protocol.OfferSpec("id1", "d0", b"{}")
    assert protocol.offer_args(DedupMode.KEEP, [spec])[:2] == ["keep", history.origin()]
    policy = protocol.Policy(1000, 3, Backoff())
    assert protocol.fetch_args(policy, 1, 5000)[9] == history.origin()
    error = "Traceback (most recent call last):\n  File 'x', line 1\nValueError: boom\n"
    assert protocol.nack_args(policy, "id", "tok", "retry", -1, error)[10] == "ValueError: boom"
    assert protocol.nack_args(policy, "id", "tok", "retry", -1, "")[10] == ""
