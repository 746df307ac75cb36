"""Flow control's pure parts (issue #20): limits as the scripts read them, pause arguments,
the limit key in an offer's options (which the outbox stores and relays as they are)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayq import ConfigError, InvalidTaskError, Limit, Offer, RateLimited
from delayq._core import protocol
from delayq._core.envelope import EnvelopeCodec
from delayq._core.handling import Verdict, outcome_of
from delayq._core.limits import (
    DEFAULT_KEY,
    check_limit_key,
    check_same_shard,
    parse_limit_rows,
    parse_pause,
    pause_args,
)
from delayq._core.offers import build_offer, is_plain
from delayq._core.sharding import shard_of
from delayq.outbox._rows import Formats, check_row, offer_row


def test_limit_encoding() -> None:
    assert Limit(rate=10).encode() == "10.0|1000000|1||1"
    assert Limit(concurrency=3).encode() == "|1000000||3|1"
    assert Limit(rate=2, per=timedelta(minutes=1), burst=5, weight=3).encode() == (
        "2.0|60000000|5||3"
    )
    limit = Limit(rate=2.5, per=0.5, burst=4, concurrency=2, weight=7)
    assert Limit.decode(limit.encode()) == limit
    assert Limit.decode(Limit(rate=10).encode()) == Limit(rate=10)


def test_limit_validation() -> None:
    with pytest.raises(ConfigError, match="over 1 per microsecond"):
        Limit(rate=10_000_000, per=1)
    with pytest.raises(ConfigError, match="at most 1000"):
        Limit(concurrency=1, weight=1001)
    assert Limit(weight=5).rate is None  # a weight alone is a valid limit


def test_limit_keys() -> None:
    assert check_limit_key("*") == "*" and check_limit_key(DEFAULT_KEY) == DEFAULT_KEY
    for bad in ("", "a|b", "~x", None, "x" * 513):
        with pytest.raises(ConfigError):
            check_limit_key(bad)
    for reserved in ("*", DEFAULT_KEY):
        with pytest.raises(InvalidTaskError):
            check_limit_key(reserved, offered=True)
    a = "t"
    b = next(k for k in (f"k{i}" for i in range(100)) if shard_of(k, 4) != shard_of(a, 4))
    with pytest.raises(InvalidTaskError, match="one shard"):
        check_same_shard(b, a, 4)
    check_same_shard(a, a, 4)


def test_an_offer_carries_its_limit_key_in_its_options() -> None:
    codec = EnvelopeCodec()
    spec = build_offer(codec, Offer("x", 0, limit_key="tenant:1"))
    assert spec.options == "@tenant:1|" and protocol.spec_limit_key(spec) == "tenant:1"
    assert protocol.spec_key(spec) is None
    both = build_offer(codec, Offer("x", 0, key="k|with|bars", priority=2, limit_key="t"))
    assert both.options == "@t|2|0|0|k|with|bars"
    assert protocol.spec_key(both) == "k|with|bars" and protocol.spec_limit_key(both) == "t"
    assert not is_plain(Offer("x", limit_key="t")) and is_plain(Offer("x"))
    with pytest.raises(InvalidTaskError):
        build_offer(codec, Offer("x", 0, limit_key="*"))


def test_the_outbox_keeps_the_limit_key() -> None:
    formats = Formats("dq", None)
    row = offer_row(formats, "orders", {"n": 1}, 30, {"limit_key": "tenant:9", "key": "k"})
    assert row["options"] == "@tenant:9|0|0|0|k"
    apply_id = "0" * 32
    item = check_row({**row, "seq": 1, "age_s": 0.0, "apply_id": apply_id})
    assert item.spec is not None and protocol.spec_limit_key(item.spec) == "tenant:9"
    with pytest.raises(InvalidTaskError):
        check_row({**row, "seq": 1, "age_s": 0.0, "apply_id": apply_id, "options": "@|0|0|0|k"})
    with pytest.raises(InvalidTaskError, match="out of range"):
        ttl = "9" * 20
        check_row(
            {**row, "seq": 1, "age_s": 0.0, "apply_id": apply_id, "options": f"@t|0|{ttl}|0|k"}
        )


def test_pause_arguments_and_replies() -> None:
    assert pause_args(None, None) == ["pause", "", ""]
    assert pause_args(timedelta(seconds=1.5), "why") == ["pause", "d1500", "why"]
    assert pause_args(datetime(2030, 1, 1, tzinfo=UTC), None)[1] == "a1893456000000"
    for bad in (datetime(2030, 1, 1), "soon", timedelta(0), float("nan")):
        with pytest.raises(ConfigError):
            pause_args(bad, None)  # type: ignore[arg-type]
    info = parse_pause([1, 0, 1893456000000, b"note"])
    assert info.paused and info.until is None and info.note == "note"
    assert not parse_pause([0, -1, -1, b""]).paused
    with pytest.raises(ConfigError, match="not after"):
        parse_pause([2, 5, 10, b""])


def test_limit_rows() -> None:
    rows = parse_limit_rows(
        [b"t", b"", 2, 3, 1893456000000, b"1", b"*", b"|1000000||4|1", 4, 0, -1, b""]
    )
    assert rows[0].limit is None and rows[0].limit_of == DEFAULT_KEY and rows[0].waiting == 3
    assert rows[0].next_admission_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert rows[1].limit == Limit(concurrency=4) and rows[1].next_admission_at is None


def test_rate_limited_is_a_throttle_not_a_failure() -> None:
    outcome = outcome_of(RateLimited(2.5), attempts=10, max_attempts=10)
    assert outcome.verdict is Verdict.THROTTLE and outcome.delay == 2.5 and not outcome.dead
    bad = outcome_of(RateLimited(-1), attempts=1, max_attempts=10)
    assert bad.verdict is Verdict.THROTTLE and bad.delay == 1.0
    assert outcome_of(RateLimited(timedelta(minutes=1)), 1, 3).delay == 60.0
