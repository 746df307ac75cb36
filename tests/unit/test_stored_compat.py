"""Tasks written by delayq 0.1.0 stay readable: the bytes below were produced by that release's
encoder (stdlib json, msgpack, and pydantic for typed payloads) before typed payloads moved to
msgspec. Pure, no Redis."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import msgpack
import pydantic
import pytest

from delayq._core.codecs import PayloadType
from delayq._core.envelope import EnvelopeCodec


@dataclass
class Order:
    order_id: int
    items: list[str] = field(default_factory=list)
    placed: datetime | None = None


class Refund(pydantic.BaseModel):
    order_id: int
    amount_cents: int
    reason: str = ""


class Color(enum.Enum):
    RED = "red"


@dataclass
class Line:
    sku: str
    price: Decimal
    shipped: datetime | None = None


@dataclass
class Shipment:
    id: UUID
    lines: list[Line]
    color: Color
    on: date


ORDER = Order(7, ["a", "b"], datetime(2024, 5, 1, 12, tzinfo=UTC))
SHIPMENT = Shipment(
    UUID("12345678-1234-5678-1234-567812345678"),
    [Line("a", Decimal("12.50"), datetime(2024, 5, 1, 12, 30, 0, 250000, tzinfo=UTC))],
    Color.RED,
    date(2024, 5, 2),
)

# (codec, payload type, bytes as 0.1.0 stored them, the payload they must read back as)
WRITTEN_BY_0_1_0 = [
    ("json", None, b'={"order_id":42,"note":"h\xc3\xa9llo"}', {"order_id": 42, "note": "héllo"}),
    (
        "json",
        None,
        b'{"p":{"order_id":43},"h":{"trace":"abc"},"pr":5,"k":"order:43"}',
        {"order_id": 43},
    ),
    (
        "json",
        Order,
        b'{"p":{"order_id":7,"items":["a","b"],"placed":"2024-05-01T12:00:00Z"},'
        b'"ty":"__main__.Order"}',
        ORDER,
    ),
    (
        "json",
        Refund,
        b'{"p":{"order_id":7,"amount_cents":1250,"reason":"damaged"},"ty":"__main__.Refund"}',
        Refund(order_id=7, amount_cents=1250, reason="damaged"),
    ),
    (
        "msgpack",
        None,
        b"\x82\xa1p\x82\xa8order_id*\xa4blob\xc4\x02\x00\xff\xa1c\xa7msgpack",
        {"order_id": 42, "blob": b"\x00\xff"},
    ),
    (
        "msgpack",
        Order,
        b"\x83\xa1p\x83\xa8order_id\x07\xa5items\x92\xa1a\xa1b\xa6placed\xb42024-05-01T12:00:00Z"
        b"\xa2ty\xae__main__.Order\xa1c\xa7msgpack",
        ORDER,
    ),
    (
        "msgpack",
        Refund,
        b"\x83\xa1p\x83\xa8order_id\x07\xacamount_cents\xcd\x04\xe2\xa6reason\xa0\xa2ty"
        b"\xaf__main__.Refund\xa1c\xa7msgpack",
        Refund(order_id=7, amount_cents=1250),
    ),
    # a nested dataclass with UUID, Decimal, enum and date fields: 0.1.0 wrote it through
    # pydantic (without pydantic it raised EncodeError)
    (
        "json",
        Shipment,
        b'{"p":{"id":"12345678-1234-5678-1234-567812345678","lines":[{"sku":"a","price":"12.50",'
        b'"shipped":"2024-05-01T12:30:00.250000Z"}],"color":"red","on":"2024-05-02"},'
        b'"ty":"__main__.Shipment"}',
        SHIPMENT,
    ),
    (
        "msgpack",
        Shipment,
        b"\x83\xa1p\x84\xa2id\xd9$12345678-1234-5678-1234-567812345678\xa5lines\x91\x83\xa3sku"
        b"\xa1a\xa5price\xa512.50\xa7shipped\xbb2024-05-01T12:30:00.250000Z\xa5color\xa3red"
        b"\xa2on\xaa2024-05-02\xa2ty\xb1__main__.Shipment\xa1c\xa7msgpack",
        SHIPMENT,
    ),
]


@pytest.mark.parametrize(("name", "payload_type", "stored", "payload"), WRITTEN_BY_0_1_0)
def test_a_task_written_by_0_1_0_reads_back(
    name: str, payload_type: type | None, stored: bytes, payload: object
) -> None:
    codec = EnvelopeCodec(name, PayloadType(payload_type) if payload_type else None)
    assert codec.decode(stored).payload == payload


def parsed(name: str, data: bytes) -> dict[str, object]:
    """The stored envelope as data, without the type tag (it names the writing module)."""
    if data[:1] == b"=":
        return {"p": json.loads(data[1:])}
    doc = json.loads(data) if name == "json" else msgpack.unpackb(data, raw=False)
    doc.pop("ty", None)
    return dict(doc)


@pytest.mark.parametrize(("name", "payload_type", "stored", "payload"), WRITTEN_BY_0_1_0)
def test_this_release_stores_what_0_1_0_stored(
    name: str, payload_type: type | None, stored: bytes, payload: object
) -> None:
    """The same envelope for the same payload, so a task offered by this release is readable
    by a consumer still running 0.1.0 during a rolling upgrade."""
    codec = EnvelopeCodec(name, PayloadType(payload_type) if payload_type else None)
    options: dict[str, object] = {}
    if b'"pr":5' in stored:
        options = {"headers": {"trace": "abc"}, "priority": 5, "key": "order:43"}
    written = codec.encode(payload, **options)  # type: ignore[arg-type]
    assert parsed(name, written) == parsed(name, stored)
