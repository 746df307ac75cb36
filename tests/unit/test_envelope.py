"""The task envelope and its codecs (delayq._core.envelope / codecs): pure, no Redis."""

from __future__ import annotations

import base64
import json
import math
import pickle
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgpack
import pydantic
import pytest

from delayq import (
    ConfigError,
    DecodeError,
    DelayqError,
    EncodeError,
    InvalidTaskError,
    PayloadTooLarge,
)
from delayq._core.codecs import CODECS, PayloadType, check_codec
from delayq._core.envelope import ENVELOPE_VERSION, Envelope, EnvelopeCodec

PAYLOADS: list[Any] = [
    None,
    0,
    -7,
    2**62,
    1.25,
    "",
    "héllo ✓ \x00 \n",
    True,
    [],
    [1, "two", None, [3.5]],
    {},
    {"order_id": 42, "items": [{"sku": "a", "qty": 2}], "note": None},
]


@dataclass(frozen=True)
class Point:
    """A module-level class so pickle can find it."""

    x: int
    y: int


def codec(name: str = "json", payload_type: type | None = None, **kw: Any) -> EnvelopeCodec:
    return EnvelopeCodec(name, PayloadType(payload_type) if payload_type else None, **kw)


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_round_trip(name: str, payload: Any) -> None:
    c = codec(name)
    env = c.decode(c.encode(payload))
    assert env == Envelope(payload)
    assert type(env.payload) is type(payload)


@pytest.mark.parametrize("name", CODECS)
def test_round_trip_with_options(name: str) -> None:
    c = codec(name)
    data = c.encode({"a": 1}, headers={"trace": "abc", "ü": "✓"}, priority=7, key="order:1")
    env = c.decode(data)
    assert env.payload == {"a": 1}
    assert dict(env.headers) == {"trace": "abc", "ü": "✓"}
    assert env.priority == 7
    assert env.key == "order:1"
    assert env.type_tag is None


def test_a_plain_json_payload_is_stored_bare_and_readable() -> None:
    data = codec().encode({"n": 1})
    assert data == b'={"n":1}'  # one byte over the payload, still readable in redis-cli
    assert codec().decode(data).payload == {"n": 1}
    assert ENVELOPE_VERSION == 1


def test_the_bare_form_reads_every_json_value_and_typed_payloads() -> None:
    for payload in ("x", 0, None, [1, {"a": "é"}], {"p": 1}):
        assert codec().decode(codec().encode(payload)).payload == payload
    with pytest.raises(DecodeError):
        codec().decode(b"={not json")


def test_the_full_envelope_of_earlier_writes_still_decodes() -> None:
    assert codec().decode(b'{"p":{"n":1}}').payload == {"n": 1}


def test_envelopes_written_with_an_explicit_version_still_decode() -> None:
    assert codec().decode(b'{"v":1,"p":{"n":1}}').payload == {"n": 1}
    with pytest.raises(DecodeError, match="version"):
        codec().decode(b'{"v":2,"p":{"n":1}}')


def test_json_envelope_optional_fields_appear_only_when_set() -> None:
    doc = json.loads(codec().encode("x", headers={"h": "1"}, priority=3, key="k"))
    assert doc == {"p": "x", "h": {"h": "1"}, "pr": 3, "k": "k"}
    assert codec().encode("x", headers={}, priority=0, key=None) == b'="x"'


def test_json_keeps_non_ascii_as_utf8() -> None:
    data = codec().encode("héllo")
    assert "héllo".encode() in data


def test_msgpack_envelope_is_tagged_and_carries_bytes() -> None:
    c = codec("msgpack")
    data = c.encode({"blob": b"\x00\xff"})
    assert not data.startswith(b"{")
    doc = msgpack.unpackb(data, raw=False)
    assert doc["c"] == "msgpack" and "v" not in doc
    assert c.decode(data).payload == {"blob": b"\x00\xff"}


def test_any_codec_reads_json_and_msgpack_envelopes() -> None:
    for reader in CODECS:
        assert codec(reader).decode(codec("json").encode([1])).payload == [1]
        assert codec(reader).decode(codec("msgpack").encode([1])).payload == [1]


def test_pickle_round_trips_arbitrary_objects() -> None:
    c = codec("pickle")
    payload = {"when": datetime(2024, 1, 2, tzinfo=UTC), "tags": {1, 2}, "pt": Point(1, 2)}
    data = c.encode(payload)
    doc = json.loads(data)  # the pickle travels base64-encoded inside a JSON envelope
    assert doc["c"] == "pickle" and "v" not in doc
    assert pickle.loads(base64.b64decode(doc["p"])) == payload
    assert c.decode(data).payload == payload


@pytest.mark.parametrize("reader", ["json", "msgpack"])
def test_pickle_is_refused_unless_the_queue_opted_in(reader: str) -> None:
    data = codec("pickle").encode(Point(1, 2))
    with pytest.raises(DecodeError, match="pickle"):
        codec(reader).decode(data)


def test_pickle_refusal_never_unpickles(monkeypatch: pytest.MonkeyPatch) -> None:
    data = codec("pickle").encode([1])

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle.loads must not be called")

    monkeypatch.setattr(pickle, "loads", boom)
    with pytest.raises(DecodeError):
        codec("json").decode(data)


def test_corrupt_pickle_is_a_decode_error() -> None:
    data = json.dumps({"v": 1, "c": "pickle", "p": base64.b64encode(b"garbage").decode()})
    with pytest.raises(DecodeError, match="pickled payload"):
        codec("pickle").decode(data.encode())


# -- codecs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["json", "msgpack", "pickle"])
def test_check_codec_accepts_known_codecs(name: str) -> None:
    assert check_codec(name) == name


@pytest.mark.parametrize("name", ["xml", "JSON", "", None, 1, "yaml"])
def test_check_codec_rejects_unknown(name: object) -> None:
    with pytest.raises(ConfigError, match="unknown codec"):
        check_codec(name)


# -- encode errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("json", {1, 2}),
        ("json", object()),
        ("json", b"bytes"),
        ("json", math.nan),
        ("json", {"x": math.inf}),
        ("json", datetime(2024, 1, 1, tzinfo=UTC)),
        ("msgpack", object()),
        ("msgpack", {1, 2}),
        ("msgpack", 2**70),
        ("pickle", lambda: None),
    ],
)
def test_unencodable_payload_is_an_encode_error(name: str, payload: Any) -> None:
    with pytest.raises(EncodeError):
        codec(name).encode(payload)


def test_encode_error_is_an_invalid_task_and_a_type_error() -> None:
    with pytest.raises(InvalidTaskError):
        codec().encode({1})
    with pytest.raises(TypeError):
        codec().encode({1})


def test_too_deeply_nested_payload_is_an_encode_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(EncodeError):
        codec().encode(deep)


# -- size limit -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
def test_payload_too_large(name: str) -> None:
    size = len(codec(name).encode("x" * 100))
    assert codec(name, max_bytes=size).decode(codec(name, max_bytes=size).encode("x" * 100))
    with pytest.raises(PayloadTooLarge, match=f"over the limit of {size - 1}"):
        codec(name, max_bytes=size - 1).encode("x" * 100)


def test_size_limit_counts_headers_and_key() -> None:
    c = codec(max_bytes=64)
    c.encode("x")
    with pytest.raises(PayloadTooLarge):
        c.encode("x", headers={"h": "y" * 64})
    with pytest.raises(PayloadTooLarge):
        c.encode("x", key="k" * 64)


def test_payload_too_large_is_an_invalid_task() -> None:
    assert issubclass(PayloadTooLarge, InvalidTaskError)
    assert issubclass(PayloadTooLarge, DelayqError)


# -- decode errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff\xfe\xfd",
        b"{",
        b"{not json}",
        b'{"v": 1, "p": 1',
        b"{\xff\xfe}",
        b"[1, 2]",
        b"hello",
        b"{}",
        b'{"v": 1}',
        b'{"v": "1", "p": 1}',
        b'{"v": 2, "p": 1}',
        b'{"v": "1", "p": 1}',
        b'{"v": null, "p": 1}',
        b'{"v": 1.0, "p": 1}',
        b'{"v": 1, "p": 1, "h": []}',
        b'{"v": 1, "p": 1, "h": "x"}',
        b'{"v": 1, "p": 1, "pr": "9"}',
        b'{"v": 1, "p": 1, "pr": 1.5}',
        b'{"v": 1, "p": 1, "c": "pickle"}',
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 1}),
        msgpack.packb({"v": 99, "p": 1}),
        msgpack.packb({"v": 1, "p": 1})[:-1],
        msgpack.packb("just a string"),
    ],
)
@pytest.mark.parametrize("name", CODECS)
def test_undecodable_bytes_are_a_decode_error(name: str, data: bytes) -> None:
    with pytest.raises(DecodeError):
        codec(name).decode(data)


def test_newer_envelope_version_is_refused_with_its_version() -> None:
    data = json.dumps({"v": ENVELOPE_VERSION + 1, "p": 1}).encode()
    with pytest.raises(DecodeError, match="version 2"):
        codec().decode(data)


def test_deeply_nested_stored_task_is_a_decode_error() -> None:
    depth = 100_000
    data = b'{"v":1,"p":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(DecodeError):
        codec().decode(data)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)
    assert issubclass(DecodeError, DelayqError)
    assert not issubclass(DecodeError, InvalidTaskError)


# -- typed payloads ---------------------------------------------------------------------------


@dataclass
class Order:
    order_id: int
    items: list[str] = field(default_factory=list)
    placed: datetime | None = None


@dataclass
class Invoice:
    number: str


class Refund(pydantic.BaseModel):
    order_id: int
    amount_cents: int
    reason: str = ""


def test_dataclass_round_trip() -> None:
    c = codec(payload_type=Order)
    order = Order(7, ["a", "b"], datetime(2024, 5, 1, 12, tzinfo=UTC))
    data = c.encode(order)
    doc = json.loads(data)
    assert doc["ty"] == f"{__name__}.Order"
    assert "tv" not in doc  # version 1 is implicit
    assert doc["p"] == {"order_id": 7, "items": ["a", "b"], "placed": "2024-05-01T12:00:00Z"}
    env = c.decode(data)
    assert env.payload == order
    assert isinstance(env.payload, Order)
    assert env.type_tag == f"{__name__}.Order"


def test_pydantic_model_round_trip() -> None:
    c = codec(payload_type=Refund)
    refund = Refund(order_id=7, amount_cents=1250, reason="damaged")
    env = c.decode(c.encode(refund))
    assert env.payload == refund
    assert isinstance(env.payload, Refund)


@pytest.mark.parametrize("name", ["msgpack", "pickle"])
def test_typed_payloads_work_with_every_codec(name: str) -> None:
    c = codec(name, payload_type=Order)
    order = Order(1, ["x"])
    assert c.decode(c.encode(order)).payload == order


@pytest.mark.parametrize(
    ("payload_type", "wrong"),
    [
        (Order, {"order_id": 1}),
        (Order, Invoice("x")),
        (Order, None),
        (Refund, {"order_id": 1, "amount_cents": 2}),
        (Refund, Order(1)),
    ],
)
def test_encoding_the_wrong_type_is_an_encode_error(payload_type: type, wrong: Any) -> None:
    with pytest.raises(EncodeError, match="payload must be a"):
        codec(payload_type=payload_type).encode(wrong)


@pytest.mark.parametrize(
    ("payload_type", "stored"),
    [
        (Order, {"number": "INV-1"}),
        (Order, {"order_id": "not a number"}),
        (Order, [1, 2]),
        (Refund, {"order_id": 1}),
        (Refund, "text"),
    ],
)
def test_decoding_a_payload_of_another_shape_is_a_decode_error(
    payload_type: type, stored: Any
) -> None:
    data = codec().encode(stored)
    with pytest.raises(DecodeError, match="does not fit"):
        codec(payload_type=payload_type).decode(data)


def test_untyped_queue_reads_typed_tasks_as_plain_data() -> None:
    data = codec(payload_type=Refund).encode(Refund(order_id=1, amount_cents=5))
    env = codec().decode(data)
    assert env.payload == {"order_id": 1, "amount_cents": 5, "reason": ""}
    assert env.type_tag == f"{__name__}.Refund"


@pytest.mark.parametrize("bad", [Order(1), "Order", None, 3])
def test_payload_type_must_be_a_class(bad: object) -> None:
    with pytest.raises(ConfigError, match="must be a class"):
        PayloadType(bad)  # type: ignore[arg-type]


# Versioned payloads: the same class name at three points of its history.


@dataclass
class CustomerV1:
    name: str


@dataclass
class CustomerV2:
    __delayq_version__: ClassVar[int] = 2
    first: str
    last: str
    upgraded_from: ClassVar[list[int]] = []

    @classmethod
    def __delayq_upgrade__(cls, data: dict[str, Any], from_version: int) -> dict[str, Any]:
        cls.upgraded_from.append(from_version)
        first, _, last = data["name"].partition(" ")
        return {"first": first, "last": last}


@dataclass
class CustomerV2NoUpgrade:
    __delayq_version__: ClassVar[int] = 2
    first: str
    last: str


def test_payload_version_is_written_when_not_1() -> None:
    doc = json.loads(codec(payload_type=CustomerV2).encode(CustomerV2("Ada", "Lovelace")))
    assert doc["tv"] == 2
    assert doc["p"] == {"first": "Ada", "last": "Lovelace"}


def test_current_version_round_trips_without_upgrading() -> None:
    CustomerV2.upgraded_from.clear()
    c = codec(payload_type=CustomerV2)
    assert c.decode(c.encode(CustomerV2("Ada", "Lovelace"))).payload == CustomerV2(
        "Ada", "Lovelace"
    )
    assert CustomerV2.upgraded_from == []


def test_older_version_is_upgraded() -> None:
    CustomerV2.upgraded_from.clear()
    old = codec(payload_type=CustomerV1).encode(CustomerV1("Ada Lovelace"))
    payload = codec(payload_type=CustomerV2).decode(old).payload
    assert payload == CustomerV2("Ada", "Lovelace")
    assert CustomerV2.upgraded_from == [1]


def test_older_version_without_upgrade_is_a_decode_error() -> None:
    old = codec(payload_type=CustomerV1).encode(CustomerV1("Ada Lovelace"))
    with pytest.raises(DecodeError, match="__delayq_upgrade__"):
        codec(payload_type=CustomerV2NoUpgrade).decode(old)


def test_newer_version_is_a_decode_error_even_with_upgrade() -> None:
    new = codec(payload_type=CustomerV2).encode(CustomerV2("Ada", "Lovelace"))
    with pytest.raises(DecodeError, match="version 2"):
        codec(payload_type=CustomerV1).decode(new)


@pytest.mark.parametrize("tv", ["x", None, [2]])
def test_corrupt_payload_version_is_a_decode_error(tv: object) -> None:
    data = json.dumps({"v": 1, "p": {"name": "Ada"}, "tv": tv}).encode()
    with pytest.raises(DecodeError):
        codec(payload_type=CustomerV1).decode(data)
