"""The dashboard's pure parts: sign-in back-off, sessions, CSRF signing, origins, the bounded
history and the formatting of odd values (no Redis, a fake clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from starlette.requests import Request

from delayq import ConfigError, Stats
from delayq.dashboard import Settings, views
from delayq.dashboard.security import (
    CsrfSigner,
    Sessions,
    SignInThrottle,
    origin_of,
    origin_problem,
)
from delayq.dashboard.series import History, Sample, health


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throttle_lets_typos_through_then_doubles_the_wait() -> None:
    clock = Clock()
    throttle = SignInThrottle(free=3, base_s=1.0, max_s=8.0, forget_s=60.0, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("a") == 0
        throttle.failed("a")
    assert throttle.retry_after("a") == 0  # three free failures
    waits = []
    for _ in range(6):
        throttle.failed("a")
        waits.append(throttle.retry_after("a"))
        clock.now += waits[-1]
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # doubling, capped at max_s
    assert throttle.retry_after("b") == 0  # per client
    throttle.failed("a")
    clock.now += 8.0 + 61.0  # no failure for longer than forget_s: a fresh start
    assert throttle.retry_after("a") == 0
    throttle.failed("a")
    assert throttle.retry_after("a") == 0
    throttle.succeeded("a")


def test_throttle_remembers_a_bounded_number_of_clients() -> None:
    throttle = SignInThrottle(free=0, max_clients=100, clock=Clock())
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle._clients) == 100
    assert throttle.retry_after("10.0.3.231") > 0  # the most recent ones are kept


def test_sessions_are_random_bounded_and_end() -> None:
    clock = Clock()
    sessions = Sessions(idle_s=10.0, max_age_s=100.0, max_sessions=3, clock=clock)
    a, b = sessions.open(), sessions.open()
    assert a != b and len(a) >= 40
    assert sessions.valid(a) and sessions.valid(b)
    assert not sessions.valid("made-up") and not sessions.valid(None)
    sessions.close(a)
    assert not sessions.valid(a)
    clock.now += 11.0
    assert not sessions.valid(b)  # idle too long
    c = sessions.open()
    for _ in range(12):  # used every 9 s: idle never, but older than max_age_s in the end
        clock.now += 9.0
        alive = sessions.valid(c)
    assert not alive
    kept = [sessions.open() for _ in range(5)]
    assert len(sessions) == 3 and not sessions.valid(kept[0]) and sessions.valid(kept[-1])


def test_csrf_cookies_are_only_those_this_process_signed() -> None:
    signer, restarted = CsrfSigner(), CsrfSigner()
    cookie = signer.new_cookie()
    nonce = signer.nonce(cookie)
    assert nonce is not None
    for invented in ("A" * 43, "", "a.b", f"{nonce}.{'0' * 43}", cookie + ".x"):
        assert signer.nonce(invented) is None
    assert restarted.nonce(cookie) is None
    token = signer.form_token(nonce, "session-1")
    assert signer.form_ok(nonce, "session-1", token)
    assert not signer.form_ok(nonce, "session-2", token)  # bound to the session
    assert not signer.form_ok(nonce, None, token)
    other = signer.nonce(signer.new_cookie())
    assert not signer.form_ok(other, "session-1", token)  # and to the browser's cookie
    assert not signer.form_ok(None, "session-1", token)
    assert not signer.form_ok(nonce, "session-1", None)
    assert not signer.form_ok(nonce, "session-1", "\udcff")


def request(scheme: str, host: str, **headers: str) -> Request:
    raw = [(b"host", host.encode())] + [
        (k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()
    ]
    scope = {"type": "http", "method": "POST", "scheme": scheme, "path": "/", "headers": raw,
             "query_string": b"", "server": ("127.0.0.1", 80)}  # fmt: skip
    return Request(scope)


def test_origins_compare_scheme_host_and_port() -> None:
    assert origin_of("http://127.0.0.1") == origin_of("http://127.0.0.1:80/x?y")
    assert origin_of("HTTPS://Queues.Internal/") == "https://queues.internal:443"
    assert origin_of("null") is None and origin_of("http://[::1") is None
    assert origin_problem(request("http", "127.0.0.1:8781", origin="http://127.0.0.1:8781")) is None
    assert origin_problem(request("http", "127.0.0.1:8781", origin="http://127.0.0.1:8799"))
    assert origin_problem(request("http", "queues", origin="https://queues"))  # scheme differs
    assert origin_problem(request("https", "queues", origin="https://queues:443")) is None
    assert origin_problem(request("http", "127.0.0.1:8781", origin="null"))
    assert origin_problem(request("http", "h", sec_fetch_site="same-origin")) is None
    assert origin_problem(request("http", "h", sec_fetch_site="same-site"))
    assert origin_problem(request("http", "h", sec_fetch_site="none"))
    assert origin_problem(request("http", "h:81", referer="http://h:81/q/x")) is None
    assert origin_problem(request("http", "h:81", referer="http://h:82/q/x"))
    assert origin_problem(request("http", "h"))  # says nothing: refused


def test_history_tracks_a_bounded_number_of_queues() -> None:
    history = History(window_s=3600, interval_s=5, max_queues=2, evict_idle_s=60)

    def round_at(t: float, delivered: dict[str, int]) -> None:
        history.record({n: Sample(t, d, d, {}) for n, d in delivered.items()}, t)

    round_at(0, {"a": 0, "b": 0})
    assert history.queues == ["a", "b"]
    round_at(5, {"a": 1, "b": 0, "c": 3})
    assert history.queues == ["a", "b"]  # no slot free for c, b not idle for 60 s yet
    round_at(65, {"a": 2, "b": 0, "c": 4})
    assert history.queues == ["a", "c"]  # b idle 65 s: its slot goes to c, which moved
    round_at(70, {"a": 3, "c": 5})
    round_at(75, {"a": 4})  # c left the registry: forgotten
    assert history.queues == ["a"]
    # The total counts every queue's deltas, tracked or not (c's first sight counts nothing).
    assert [s.delivered for s in history._total] == [0, 1, 3, 5, 6]
    assert sum(b.delivered for b in history.total_bins(76, 60)) == 6


def test_health_flags_dead_tasks() -> None:
    now = datetime.now(UTC)
    dead = Stats("q", 0, 0, 0, 2, 0, 0.0, None)
    assert health(dead, now, History()) == "dead"
    late = Stats("q", 0, 1, 0, 2, 1, 5.0, None, consumer_seen_at=now - timedelta(seconds=1))
    assert health(late, now, History()) == "late"  # the worse one wins


def test_times_read_at_a_glance() -> None:
    now = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
    cases = {0.4: "now", 5.2: "in 5s", -5.2: "5s ago", 185: "in 3m", -7300: "2h 1m ago",
             3600: "in 1h", 90000: "in 1d 1h", -172800: "2d ago"}  # fmt: skip
    for seconds, shown in cases.items():
        assert views.ago(now + timedelta(seconds=seconds), now) == shown
    assert views.ago(None, now) == "-"
    assert views.exact(now + timedelta(milliseconds=7)) == "2026-12-01 10:00:00.007 UTC"


def test_odd_values_become_safe_text() -> None:
    assert views.text("\x1b[31mred\u202e\ud800") == "\\x1b[31mred\\u202e\\ud800"
    assert views.text(b"\xff") == "\\xff"
    assert views.text(b"\xff\xfe-id".decode("utf-8", "surrogateescape")) == "\\xff\\xfe-id"
    assert views.header_rows({1: 2, b"k": b"\xff", "a": "\u202e"}) == [
        ("1", "2"), ("a", "\\u202e"), ("k", "\\xff")
    ]  # fmt: skip
    error = "Traceback (most recent call last):\n  File x\nValueError: bad \x1b[0m\n\n"
    assert views.error_line(error) == "ValueError: bad \\x1b[0m"
    assert views.error_line(None) == ""
    assert (
        views.pretty({"s": "\udcff", 1: b"\xff"})
        == '{\n  "1": "b\'\\\\xff\'",\n  "s": "\\udcff"\n}'
    )
    assert views.quote_all("\udcff") == "%ED%B3%BF"


@pytest.mark.parametrize(
    ("message", "hidden"),
    [
        ("Error connecting to redis://u:hunter2@h:6379/0", "hunter2"),
        ("bad url 'redis://h/0?password=hunter2&db=1'", "hunter2"),
        ("unix:///run/r.sock?password=hunter2 refused", "hunter2"),
    ],
)
def test_messages_mask_the_passwords_of_their_urls(message: str, hidden: str) -> None:
    shown = views.masked(message)
    assert hidden not in shown and "***" in shown


def test_allowed_hosts_are_names() -> None:
    Settings(allowed_hosts=("queues.example.com", "10.0.0.5", "*.internal"))
    for bad in ("*", "a:8080", "", "x y", "*.*.x", "http://x"):
        with pytest.raises(ConfigError, match="not a host name"):
            Settings(allowed_hosts=(bad,))
    with pytest.raises(ConfigError, match="tuple of names"):
        Settings(allowed_hosts="queues.example.com")  # type: ignore[arg-type]
    for name in ("window_s", "sample_interval_s", "bin_s", "reconnect_timeout"):
        with pytest.raises(ConfigError, match=name):
            Settings(**{name: 0})
