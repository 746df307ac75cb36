"""The pure part of carrying schedules across a reshard (delayq._core.schedule_moves) and of
reading a schedule's payload (schedule_calls.decoded_payload): arguments and replies."""

from __future__ import annotations

from delayq._core.envelope import EnvelopeCodec
from delayq._core.schedule_calls import TOMBSTONE_MS, decoded_payload
from delayq._core.schedule_moves import (
    Taken,
    far_source,
    home_of,
    land_args,
    parse_land,
    parse_names,
    parse_take,
    settle_args,
)


def test_a_take_reply_becomes_the_landing_counted_lists() -> None:
    reply = [
        1,
        [b"ver", b"3", b"cursor", b"1000", b"mv_live", b"1", b"tpl", b"\x81\xff"],
        [b"2000", b"3000"],
        [b"s:x:1500|1500"],
        [b"r1", b"1|s:x:m:r1", 5000],
        -1,
    ]
    taken = parse_take(reply)
    assert taken is not None and taken.live and taken.tombstone_ms == 0
    args = land_args("x", "q", taken)
    assert args[:4] == ["land", "x", "q", 4]
    assert args[4:12] == [b"ver", b"3", b"cursor", b"1000", b"mv_live", b"1", b"tpl", b"\x81\xff"]
    assert args[12:] == [2, b"2000", b"3000", 1, b"s:x:1500|1500", 1, b"r1", b"1|s:x:m:r1",
                         5000, 0]  # fmt: skip
    assert parse_take([0]) is None


def test_a_removed_schedules_tombstone_keeps_the_time_it_had_left() -> None:
    taken = parse_take([1, [b"ver", b"2", b"mv_live", b"0"], [], [], [], 12_345])
    assert taken is not None and not taken.live and taken.tombstone_ms == 12_345
    no_ttl = parse_take([1, [b"ver", b"2", b"mv_live", b"0"], [], [], [], -1])
    assert no_ttl is not None and no_ttl.tombstone_ms == TOMBSTONE_MS
    assert land_args("x", "q", Taken({}, [], [], [], 7))[-1] == 7


def test_settling_reads_the_old_tombstone() -> None:
    tombstone = [b"live", b"1", b"missed", b"4", b"last_out", b"ok", b"last_end", b"99"]
    assert settle_args("x", tombstone) == ["settle", "x", 1, 4, b"ok", 99, 0]
    assert settle_args("x", []) == ["settle", "x", 0, 0, b"", 0, 0], "expired: nothing alive"
    assert far_source({"far": b"2", "far_q": b"q"}) == "q"
    assert far_source({"far": b"0", "far_q": b"q"}) is None and far_source({}) is None


def test_names_homes_and_landings() -> None:
    assert parse_names([[b"a", b"b"], [b"gone"]]) == ["a", "b", "gone"]
    layout = ["q~0.1", "q~1.2", "q~2.3"]
    assert all(home_of(n, layout) in layout for n in ("a", "b", "c"))
    assert home_of("a", ["q"]) == "q"
    assert parse_land([1, 3, 16]) == (1, 3, 16)


def test_a_payload_the_reader_cannot_decode_is_reported_not_raised() -> None:
    pickled = EnvelopeCodec("pickle").encode({1, 2})
    assert decoded_payload(EnvelopeCodec("pickle"), pickled) == ({1, 2}, None)
    payload, error = decoded_payload(EnvelopeCodec("json"), pickled)
    assert payload is None and error is not None and "pickled" in error
    assert decoded_payload(EnvelopeCodec("json"), b"\xc1garbage")[0] is None
    assert decoded_payload(EnvelopeCodec("json"), None) == (None, "no payload stored")
