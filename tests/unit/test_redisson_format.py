"""Redisson's storage as delayq reads and writes it: member formats, codecs, move arguments
and the summary (pure: no Redis)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from delayq import ConfigError, DecodeError
from delayq._core.envelope import EnvelopeCodec
from delayq._core.redisson import (
    CLASS_HEADER,
    MemberFormat,
    RedissonCodec,
    RedissonKeys,
    codec_of,
    decode_value,
    encode_value,
    pack_member,
    unpack_member,
)
from delayq._core.redisson_moves import (
    Backlog,
    Counts,
    Decoding,
    Source,
    Status,
    Summary,
    claimed,
    move_args,
    statuses,
)


def test_keys_follow_redissons_prefix_name() -> None:
    keys = RedissonKeys("orders")
    assert keys.timeouts == "redisson_delay_queue_timeout:{orders}"
    assert keys.members == "redisson_delay_queue:{orders}"
    assert keys.channel == "redisson_delay_queue_channel:{orders}"
    assert keys.destination == "orders"
    # a name with its own hash tag keeps it (Redisson's prefixName)
    assert RedissonKeys("{shop}orders").timeouts == "redisson_delay_queue_timeout:{shop}orders"


@pytest.mark.parametrize("fmt", list(MemberFormat))
def test_members_round_trip_in_both_formats(fmt: MemberFormat) -> None:
    member = pack_member("заказ-42".encode(), fmt)
    parts = unpack_member(member)
    assert parts.format is fmt and parts.value == "заказ-42".encode()
    assert len(parts.random_id) == 8


def test_current_format_is_bc0lc0_native_little_endian() -> None:
    member = pack_member(b"abc")
    assert member[0] == 8 and struct.unpack_from("<Q", member, 9) == (3,)
    assert member[17:] == b"abc" and len(member) == 20


def test_a_member_of_neither_format_is_a_decode_error() -> None:
    for bad in (b"", b"\x08short", b"\x01" * 30, pack_member(b"abc")[:-1]):
        with pytest.raises(DecodeError, match="neither"):
            unpack_member(bad)


def test_string_codec() -> None:
    assert encode_value("ü", RedissonCodec.STRING) == "ü".encode()
    assert decode_value("ü".encode(), RedissonCodec.STRING).payload == "ü"
    with pytest.raises(DecodeError, match="not UTF-8"):
        decode_value(b"\xff\xfe", RedissonCodec.STRING)
    with pytest.raises(TypeError):
        encode_value(42, RedissonCodec.STRING)


def test_json_jackson_codec_keeps_or_drops_the_class() -> None:
    data = encode_value({"orderId": 2**60}, RedissonCodec.JSON_JACKSON, "com.shop.Timeout")
    assert json.loads(data) == {"@class": "com.shop.Timeout", "orderId": 2**60}
    kept = decode_value(data, RedissonCodec.JSON_JACKSON)
    assert kept.payload == {"orderId": 2**60} and kept.java_class == "com.shop.Timeout"
    dropped = decode_value(data, RedissonCodec.JSON_JACKSON, keep_class=False)
    assert dropped.payload == {"orderId": 2**60} and dropped.java_class is None
    assert decode_value(b'"text"', RedissonCodec.JSON_JACKSON).payload == "text"
    with pytest.raises(DecodeError, match="not JSON"):
        decode_value(b"{nope", RedissonCodec.JSON_JACKSON)
    with pytest.raises(TypeError, match="java_class"):
        encode_value([1], RedissonCodec.JSON_JACKSON, "java.util.ArrayList")


def test_unknown_codec_names_the_known_ones() -> None:
    assert codec_of("json-jackson") is RedissonCodec.JSON_JACKSON
    with pytest.raises(ConfigError, match="string, json-jackson"):
        codec_of("fst")


def test_decoding_makes_tasks_and_dead_letters() -> None:
    decoding = Decoding(RedissonCodec.JSON_JACKSON, EnvelopeCodec())
    raw = pack_member(encode_value({"id": 1}, RedissonCodec.JSON_JACKSON, "a.B"))
    task = decoding.pending(raw)
    assert task.task_id == "rdq-" + unpack_member(raw).random_id.hex()
    assert task.error == "" and task.format is MemberFormat.CURRENT
    envelope = EnvelopeCodec().decode(task.envelope)
    assert envelope.payload == {"id": 1} and envelope.headers == {CLASS_HEADER: "a.B"}
    # the same member always gets the same id
    assert decoding.pending(raw).task_id == task.task_id

    not_json = decoding.pending(pack_member(b"{broken"))
    garbage = decoding.pending(b"\x00\x01")
    for dead, raw_bytes in ((not_json, pack_member(b"{broken")), (garbage, b"\x00\x01")):
        assert dead.error and dead.format is None
        payload = EnvelopeCodec().decode(dead.envelope).payload
        assert base64.b64decode(payload["raw_base64"])[-len(raw_bytes[-2:]) :] == raw_bytes[-2:]
    assert base64.b64decode(EnvelopeCodec().decode(garbage.envelope).payload["raw_base64"]) == (
        b"\x00\x01"
    )
    ready = decoding.ready(b'"due"', "n1", 3)
    assert ready.task_id == "rdq-r-n1-3" and ready.format is None


def test_move_args_statuses_and_claims() -> None:
    decoding = Decoding(RedissonCodec.STRING, EnvelopeCodec())
    item = decoding.pending(pack_member(b"x"))
    assert move_args(Source.PENDING, [item]) == ["p", item.raw, item.task_id, b'="x"', ""]
    assert statuses(b"1203") == [Status.MOVED, Status.DEAD, Status.GONE, Status.TAKEN]
    blob = struct.pack(">dI", 1234, 3) + b"abc" + struct.pack(">dI", -1, 0)
    assert claimed(blob) == [(1234, b"abc"), (-1, b"")]


def test_counts_and_summary_text() -> None:
    decoding = Decoding(RedissonCodec.STRING, EnvelopeCodec())
    items = [decoding.pending(pack_member(b"a")), decoding.pending(b"bad")]
    counts = Counts()
    assert counts.add(items, [Status.MOVED, Status.DEAD]) == 2
    empty = Backlog(0, 0, 0, 0, 0, None, None)
    summary = Summary("orders", "orders", "atomic", "2026-12-01T22:00:00+00:00", 2.0,
                      counts, Backlog(2, 2, 0, 0, 0, 1, 2), empty)  # fmt: skip
    text = summary.text()
    assert "moved           1 tasks (3.21.1+: 1), 1/s over the run" in text
    assert "dead-lettered   1" in text and empty.empty


def test_the_redisson_face_pairs_sync_and_async_classes() -> None:
    import inspect

    import delayq.redisson as face

    assert face.__all__ == sorted(face.__all__)
    for sync, async_ in (
        (face.RedissonDelayedQueue, face.AsyncRedissonDelayedQueue),
        (face.Migration, face.AsyncMigration),
    ):
        public = {n for n in dir(sync) if not n.startswith("_")}
        assert public == {n for n in dir(async_) if not n.startswith("_")}
        for method in public:
            if callable(getattr(sync, method)):
                assert inspect.signature(getattr(sync, method)) == inspect.signature(
                    getattr(async_, method)
                ), method


def test_queues_that_do_not_migrate_carry_none_of_it() -> None:
    """The shared Lua library's land_task goes only into the Redisson scripts: every other
    script's source (so its SHA and its cost per call) is what it was without it."""
    from delayq._core.scripts import Op, script

    for op in Op:
        source = script(op).source
        if op.value.startswith("redisson_"):
            continue
        assert "land_task" not in source and "redisson" not in source.lower(), op
    assert "local function land_task" in script(Op.REDISSON_MOVE).source
    assert "local function land_task" in script(Op.REDISSON_LAND).source
