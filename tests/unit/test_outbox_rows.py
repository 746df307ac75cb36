"""The outbox's pure parts: statements, row building and the relay's checks of a claimed row."""

from __future__ import annotations

from typing import Any

import pytest

from delayq._core.envelope import EnvelopeCodec
from delayq.exceptions import ConfigError, InvalidTaskError
from delayq.outbox import QueueFormat
from delayq.outbox._rows import Formats, cancel_row, check_row, offer_row, reschedule_row
from delayq.outbox._schema import Schema, for_psycopg


def test_parameters_become_psycopg_style_and_casts_are_left_alone() -> None:
    assert for_psycopg("a = :a AND b = :b_2") == "a = %(a)s AND b = %(b_2)s"
    assert for_psycopg("x::text, 'a:b'") == "x::text, 'a:b'"
    for sql in (Schema().insert, Schema().claim(), Schema().cancel, *Schema().install()):
        assert "%" not in sql and "::" not in sql


@pytest.mark.parametrize("name", ["", "1abc", "a-b", 'x"y', "a" * 52, "a b"])
def test_object_names_are_checked(name: str) -> None:
    with pytest.raises(ConfigError):
        Schema(name)
    with pytest.raises(ConfigError):
        Schema("ok", name)


def test_names_and_channel() -> None:
    assert Schema("jobs", "app").qualified == '"app"."jobs"'
    assert Schema("jobs", "app").channel == "app.jobs"
    assert Schema().listen == 'LISTEN "delayq_outbox"'


def test_offer_row_is_what_the_queue_would_write() -> None:
    formats = Formats("dq", None)
    row = offer_row(
        formats, "orders", {"n": 1}, 30, {"key": "k", "priority": 3, "headers": {"h": "v"}}
    )
    assert (row["op"], row["due_kind"], row["due_ms"], row["dedup"]) == (
        "offer",
        "d",
        30000,
        "keep",
    )
    assert EnvelopeCodec().decode(row["envelope"]).payload == {"n": 1}
    assert row["options"] == "3|0|0|k"
    assert len(row["task_id"]) == 14


APPLY_ID = "0b9f4c5e-3c1d-4a8e-9d59-6f0a3a1b2c3d"


def claimed(**changes: Any) -> dict[str, Any]:
    formats = Formats("dq", {"q": QueueFormat(dedup="replace")})
    row: dict[str, Any] = offer_row(formats, "q", "x", 5, {"key": None, "dedup": None})
    row.update({"seq": 1, "age_s": 0.5, "apply_id": APPLY_ID, **changes})
    return row


def test_check_row_accepts_what_the_outbox_writes() -> None:
    item = check_row(claimed())
    assert item.spec is not None and item.spec.due == "d5000" and item.dedup == "replace"
    assert check_row(claimed(op="cancel", envelope=None, due_kind=None, due_ms=None)).op == "cancel"
    re = reschedule_row(Formats("dq", None), "q", "abc", None, 1e9)
    assert check_row({**re, "seq": 2, "age_s": 0.0, "apply_id": APPLY_ID}).due_kind == "a"
    assert cancel_row(Formats("dq", None), "q", "abc")["task_id"] == "abc"


@pytest.mark.parametrize(
    "changes",
    [
        {"envelope": b"{nope"},
        {"envelope": b""},
        {"envelope": None},
        {"envelope": b'{"no_p": 1}'},
        {"due_kind": "x"},
        {"due_ms": -1},
        {"due_ms": 10**18},
        {"options": "1|2"},
        {"dedup": "maybe"},
        {"queue": "no spaces"},
        {"prefix": ""},
        {"task_id": ""},
        {"op": "explode"},
        {"apply_id": None},
        {"options": "0|0|" + "9" * 400 + "|"},
        {"options": "0|" + "9" * 5000 + "|0|k"},
        {"apply_id": "not-an-id"},
    ],
)
def test_check_row_refuses_rows_nobody_can_apply(changes: dict[str, Any]) -> None:
    with pytest.raises((InvalidTaskError, ConfigError)):
        check_row(claimed(**changes))


def test_queue_formats_are_checked() -> None:
    with pytest.raises(ConfigError):
        Formats("dq", {"q": QueueFormat(codec="yaml")})
    with pytest.raises(ConfigError):
        Formats("dq", {"q": QueueFormat(max_payload_bytes=0)})
    with pytest.raises(ConfigError):
        Formats("dq", {"bad name": QueueFormat()})
    with pytest.raises(ConfigError):
        Formats("dq", {"q": "json"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError):
        Formats("bad prefix!", None)


def test_a_batch_is_two_messages() -> None:
    schema = Schema("jobs")
    claim = schema.claim_batch(250)
    assert claim.startswith("BEGIN; DECLARE delayq_claim NO SCROLL CURSOR FOR SELECT ")
    assert claim.endswith("FETCH FORWARD 250 FROM delayq_claim")
    assert schema.finish_claim([]) == "COMMIT"
    assert schema.finish_claim([3, 1]) == 'DELETE FROM "jobs" WHERE seq IN (3, 1); COMMIT'
    with pytest.raises(ValueError):
        schema.finish_claim(["1); DROP TABLE jobs; --"])  # type: ignore[list-item]
