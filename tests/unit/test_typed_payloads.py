"""Typed payloads (delayq._core.codecs.PayloadType): the same result with or without pydantic.

Pure, no Redis. The pydantic-free checks run in a subprocess where ``import pydantic`` fails,
because this test process has pydantic installed and imported.
"""

from __future__ import annotations

import enum
import json
import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple, TypedDict
from uuid import UUID

import msgpack
import msgspec
import pydantic
import pytest

from delayq import ConfigError, DecodeError, EncodeError
from delayq._core.codecs import PayloadType
from delayq._core.envelope import EnvelopeCodec


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Line:
    sku: str
    price: Decimal
    shipped_at: datetime | None = None


@dataclass
class Shipment:
    id: UUID
    lines: list[Line]
    colour: Colour
    ship_on: date
    window: timedelta = timedelta(hours=2)
    tags: set[str] = field(default_factory=set)
    label: bytes = b""


SHIPMENT = Shipment(
    UUID("12345678-1234-5678-1234-567812345678"),
    [Line("a", Decimal("12.50"), datetime(2024, 5, 1, 12, 30, 0, 250000, tzinfo=UTC))],
    Colour.RED,
    date(2024, 5, 2),
    tags={"fragile"},
    label=b"\x00\xff",
)


class Address(TypedDict):
    city: str
    since: datetime


class Pair(NamedTuple):
    left: int
    right: Decimal


class Parcel(msgspec.Struct):
    weight_g: int
    address: Address


class Refund(pydantic.BaseModel):
    order_id: int
    amount: Decimal


@dataclass
class RefundBatch:  # a dataclass holding a pydantic model: pydantic handles the whole type
    refunds: list[Refund]


class Opaque:
    def __init__(self, value: int) -> None:
        self.value = value


@dataclass
class HoldsOpaque:
    inner: Opaque


@dataclass
class Left:
    x: int


@dataclass
class Right:
    y: int


@dataclass
class Ambiguous:
    side: Left | Right


def codec(name: str, payload_type: type) -> EnvelopeCodec:
    return EnvelopeCodec(name, PayloadType(payload_type))


@pytest.mark.parametrize("name", ["json", "msgpack", "pickle"])
def test_nested_dataclass_with_rich_fields_round_trips(name: str) -> None:
    c = codec(name, Shipment)
    back = c.decode(c.encode(SHIPMENT)).payload
    assert back == SHIPMENT
    assert type(back.lines[0]) is Line
    assert type(back.lines[0].price) is Decimal
    assert back.lines[0].shipped_at == SHIPMENT.lines[0].shipped_at
    assert type(back.id) is UUID and back.colour is Colour.RED


def test_the_stored_json_is_plain_and_readable() -> None:
    doc = json.loads(codec("json", Shipment).encode(SHIPMENT))
    assert doc["p"]["id"] == "12345678-1234-5678-1234-567812345678"
    assert doc["p"]["lines"] == [
        {"sku": "a", "price": "12.50", "shipped_at": "2024-05-01T12:30:00.250000Z"}
    ]
    assert doc["p"]["colour"] == "red" and doc["p"]["ship_on"] == "2024-05-02"
    assert doc["p"]["label"] == "AP8="  # bytes as base64 text in JSON


def test_msgpack_keeps_bytes_binary_and_times_as_text() -> None:
    doc = msgpack.unpackb(codec("msgpack", Shipment).encode(SHIPMENT), raw=False)
    assert doc["p"]["label"] == b"\x00\xff"
    assert doc["p"]["lines"][0]["shipped_at"] == "2024-05-01T12:30:00.250000Z"


@pytest.mark.parametrize(
    ("payload_type", "payload"),
    [
        (Address, Address(city="Oslo", since=datetime(2020, 1, 1, tzinfo=UTC))),
        (Pair, Pair(1, Decimal("0.1"))),
        (Parcel, Parcel(500, Address(city="Lima", since=datetime(2021, 2, 3, tzinfo=UTC)))),
        (Refund, Refund(order_id=1, amount=Decimal("9.99"))),
        (RefundBatch, RefundBatch([Refund(order_id=2, amount=Decimal("1"))])),
    ],
)
@pytest.mark.parametrize("name", ["json", "msgpack"])
def test_typeddicts_namedtuples_structs_and_pydantic_models(
    name: str, payload_type: type, payload: Any
) -> None:
    c = codec(name, payload_type)
    assert c.decode(c.encode(payload)).payload == payload


@pytest.mark.parametrize(
    ("payload_type", "match"),
    [
        (HoldsOpaque, "Opaque"),
        (Opaque, "Opaque"),
        (Ambiguous, "unions"),
    ],
)
def test_a_type_that_cannot_round_trip_is_refused_at_construction(
    payload_type: type, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        PayloadType(payload_type)


@pytest.mark.parametrize(
    "wrong",
    [
        Line("a", ["12.50"]),  # type: ignore[arg-type]  # a list where a Decimal belongs
        Line(3, Decimal(1)),  # type: ignore[arg-type]
        Line("a", Decimal(1), "yesterday"),  # type: ignore[arg-type]
    ],
)
def test_a_field_of_the_wrong_type_fails_the_offer_not_the_delivery(wrong: Line) -> None:
    with pytest.raises(EncodeError, match="does not fit"):
        codec("json", Line).encode(wrong)


def test_a_typeddict_payload_is_checked_field_by_field() -> None:
    c = codec("json", Address)
    with pytest.raises(EncodeError, match="does not fit"):
        c.encode({"city": "Oslo"})
    with pytest.raises(EncodeError, match="payload must be a"):
        c.encode(["Oslo"])


def test_stored_data_of_another_shape_is_a_decode_error() -> None:
    data = EnvelopeCodec().encode({"sku": "a", "price": "not a number"})
    with pytest.raises(DecodeError, match="does not fit"):
        codec("json", Line).decode(data)


# Runs with pydantic blocked from the first line: ``import pydantic`` raises ImportError.
NO_PYDANTIC = """
import sys
sys.modules["pydantic"] = None
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID
from delayq import ConfigError
from delayq._core.codecs import PayloadType
from delayq._core.envelope import EnvelopeCodec

@dataclass
class Line:
    sku: str
    price: Decimal
    shipped_at: datetime | None = None

@dataclass
class Shipment:
    id: UUID
    lines: list[Line]
    tags: set[str] = field(default_factory=set)

SHIPMENT = Shipment(
    UUID("12345678-1234-5678-1234-567812345678"),
    [Line("a", Decimal("12.50"), datetime(2024, 5, 1, 12, 30, tzinfo=UTC))],
    {"fragile"},
)
"""


def run_without_pydantic(body: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", NO_PYDANTIC + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_rich_dataclasses_round_trip_without_pydantic() -> None:
    out = run_without_pydantic(
        """
        assert "pydantic" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        for name in ("json", "msgpack"):
            c = EnvelopeCodec(name, PayloadType(Shipment))
            back = c.decode(c.encode(SHIPMENT)).payload
            assert back == SHIPMENT, back
            assert type(back.lines[0]) is Line and type(back.lines[0].price) is Decimal, back
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_without_pydantic_a_model_is_refused_with_the_extra_to_install() -> None:
    out = run_without_pydantic(
        """
        class Model:  # stands in for a pydantic model: a class msgspec cannot round-trip
            pass

        @dataclass
        class HoldsModel:
            model: Model

        for cls in (Model, HoldsModel):
            try:
                PayloadType(cls)
            except ConfigError as exc:
                print(exc)
        """
    )
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert all("Model" in line and "pip install delayq[typed]" in line for line in lines)


@dataclass
class Reading:
    value: float


class ModelReading(pydantic.BaseModel):
    value: float


@pytest.mark.parametrize(
    "payload", [Reading(math.nan), Reading(math.inf), ModelReading(value=math.nan)]
)
def test_a_float_json_cannot_hold_fails_the_offer(payload: Any) -> None:
    with pytest.raises(EncodeError, match="does not fit"):
        codec("json", type(payload)).encode(payload)


def test_msgpack_holds_nan_and_infinity() -> None:
    c = codec("msgpack", Reading)
    assert c.decode(c.encode(Reading(math.inf))).payload == Reading(math.inf)
    assert math.isnan(c.decode(c.encode(Reading(math.nan))).payload.value)


def test_task_ids_and_other_str_subclasses_are_stored_as_text() -> None:
    from delayq import TaskId

    c = codec("json", Line)
    data = c.encode(Line(TaskId("0Q8iJTa39cCgs9"), Decimal(1)), headers={"parent": TaskId("x")})
    assert json.loads(data)["p"]["sku"] == "0Q8iJTa39cCgs9"
    assert type(c.decode(data).payload.sku) is str
