"""Outbox rows from what a user offers, and back: pure, shared by the outboxes and the relay.

An offer is validated and encoded here with the queue's own code (``build_offer``), so a bad
payload raises inside the user's transaction, and the relay hands Redis exactly the bytes
``DelayQueue.offer`` would have written.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from .._core.codecs import load_json, load_msgpack
from .._core.durability import Durability
from .._core.envelope import BARE, EnvelopeCodec
from .._core.keys import QueueKeys
from .._core.models import DedupMode
from .._core.offers import OfferOptions, build_offer, offer_of
from .._core.options import QueueOptions, dedup_mode
from .._core.protocol import OfferSpec, check_id, new_task_id
from .._core.timing import MAX_DELAY_MS, Duration, due_spec
from ..exceptions import ConfigError, DecodeError, InvalidTaskError

# What the offer script parses out of an options field (offer.lua).
_OPTIONS: Final = re.compile(r"(?:@[^|]+\|)?(?:[0-9]\|[0-9]+\|[0-9]+\|.*)?", re.DOTALL)
_EPOCH_MS_LIMIT: Final = 253402300799000
_APPLY_ID: Final = re.compile(r"[0-9a-f-]{32,36}")


@dataclass(frozen=True, slots=True)
class QueueFormat:
    """How the tasks of one queue are encoded and written: the same options as the queue's
    own (``codec``, ``payload_type``, ``max_payload_bytes``, ``dedup``, ``durability``). The
    outbox encodes with them; the relay, which moves the encoded bytes, uses
    ``max_payload_bytes`` (a row over it goes dead) and ``durability`` (it waits for it before
    it deletes the rows)."""

    codec: str = "json"
    payload_type: type | None = None
    max_payload_bytes: int = 1 << 20
    dedup: str = "keep"
    durability: Durability | None = None

    def options(self, prefix: str = "dq") -> QueueOptions:
        """These options checked as a queue checks its own (:class:`ConfigError`)."""
        return QueueOptions.of(
            codec=self.codec,
            payload_type=self.payload_type,
            max_payload_bytes=self.max_payload_bytes,
            dedup=self.dedup,
            prefix=prefix,
            durability=self.durability,
        )

    def envelope_codec(self) -> EnvelopeCodec:
        return self.options().codec


class Formats:
    """The codec of each queue an outbox writes to (default: :class:`QueueFormat()`)."""

    def __init__(self, prefix: str, queues: Mapping[str, QueueFormat] | None) -> None:
        default = QueueFormat().options(prefix)  # validates the prefix
        self.prefix = prefix
        self._default = (default.codec, default.dedup)
        self._codecs: dict[str, tuple[EnvelopeCodec, DedupMode]] = {}
        for name, fmt in (queues or {}).items():
            QueueKeys(prefix, name)
            if not isinstance(fmt, QueueFormat):
                raise ConfigError(f"queues[{name!r}] must be a QueueFormat, not {fmt!r}")
            options = fmt.options(prefix)
            self._codecs[name] = (options.codec, options.dedup)

    def of(self, queue: str) -> tuple[EnvelopeCodec, DedupMode]:
        found = self._codecs.get(queue)
        if found is None:
            QueueKeys(self.prefix, queue)  # a name Redis keys cannot hold fails here
            return self._default
        return found


def offer_row(
    formats: Formats,
    queue: str,
    payload: Any,
    delay: Duration | None,
    options: OfferOptions,
    caller: str = "Outbox.offer",
) -> dict[str, Any]:
    """The parameters of an offer row; raises :class:`InvalidTaskError` on bad input, and
    TypeError naming ``caller`` for an unknown option."""
    codec, default_dedup = formats.of(queue)
    offer = offer_of(payload, delay, options, caller)
    dedup = options.get("dedup")
    mode = default_dedup if dedup is None else dedup_mode(dedup)
    spec = build_offer(codec, offer, new_task_id())
    return {
        "prefix": formats.prefix,
        "queue": queue,
        "task_id": spec.id,
        "op": "offer",
        "due_kind": spec.due[0],
        "due_ms": int(spec.due[1:]),
        "envelope": spec.envelope,
        "options": spec.options,
        "dedup": mode.value,
    }


def cancel_row(formats: Formats, queue: str, task_id: str) -> dict[str, Any]:
    formats.of(queue)
    return {"prefix": formats.prefix, "queue": queue, "task_id": check_id(task_id)}


def reschedule_row(
    formats: Formats,
    queue: str,
    task_id: str,
    delay: Duration | None,
    at: datetime | float | None,
) -> dict[str, Any]:
    formats.of(queue)
    kind, value = due_spec(delay, at)
    return {
        "prefix": formats.prefix,
        "queue": queue,
        "task_id": check_id(task_id),
        "op": "reschedule",
        "due_kind": kind,
        "due_ms": value,
        "envelope": None,
        "options": "",
        "dedup": "keep",
    }


@dataclass(frozen=True, slots=True)
class Claimed:
    """One claimed row, checked: what the relay applies to Redis."""

    seq: int
    prefix: str
    queue: str
    op: str
    task_id: str
    due_kind: str
    due_ms: int  # what is left of a relative delay, or epoch ms
    spec: OfferSpec | None
    dedup: str
    age_s: float
    apply_id: str = ""  # the row's own id, recorded by the script that applies it
    dropped: bool = False  # a cancel that dropped the task's rows not relayed yet

    @property
    def delay_s(self) -> float:
        return self.due_ms / 1000


def check_row(row: Mapping[str, Any], known: set[tuple[str, str]] | None = None) -> Claimed:
    """A claimed row as the relay applies it; raises :class:`InvalidTaskError` (or
    :class:`ConfigError`) for a row nobody can apply, which the relay marks dead. ``known``
    holds (prefix, queue) pairs already found valid: checked once per relay, not per row."""
    prefix, queue, op = row["prefix"], row["queue"], row["op"]
    if known is None or (prefix, queue) not in known:
        QueueKeys(prefix, queue)
        if known is not None:
            known.add((prefix, queue))
    task_id = check_id(row["task_id"], "task_id")
    due_kind, due_ms = row["due_kind"], row["due_ms"]
    spec = None
    if op in ("offer", "reschedule"):
        _check_due(due_kind, due_ms)
        due_ms = int(due_ms)
    else:
        due_kind, due_ms = "", 0
    if op == "offer":
        envelope = row["envelope"]
        if not isinstance(envelope, bytes | bytearray | memoryview) or not envelope:
            raise InvalidTaskError("offer row has no envelope")
        envelope = bytes(envelope)
        _check_envelope(envelope)
        options = row["options"]
        if not isinstance(options, str) or not _OPTIONS.fullmatch(options):
            raise InvalidTaskError(f"offer row has malformed options {repr(options)[:100]}")
        plain = options.split("|", 1)[1] if options.startswith("@") else options  # a limit key
        if plain and any(_out_of_range(ms) for ms in plain.split("|", 3)[1:3]):
            raise InvalidTaskError(
                f"offer row has a ttl or key_ttl out of range ({options[:60]!r})"
            )
        _dedup_of_row(row["dedup"])
        spec = OfferSpec(task_id, f"{due_kind}{due_ms}", envelope, options)
    elif op != "cancel" and op != "reschedule":
        raise InvalidTaskError(f"unknown outbox operation {op!r}")
    return Claimed(
        seq=int(row["seq"]),
        prefix=prefix,
        queue=queue,
        op=op,
        task_id=task_id,
        due_kind=due_kind,
        due_ms=due_ms,
        spec=spec,
        dedup=str(row["dedup"]),
        age_s=float(row["age_s"]),
        apply_id=_apply_id_of(row.get("apply_id")),
        dropped=op == "cancel" and row.get("options") == "dropped",
    )


def _apply_id_of(value: object) -> str:
    if not isinstance(value, str) or not _APPLY_ID.fullmatch(value):
        raise InvalidTaskError(f"row has a malformed apply id {value!r}")
    return value


def _out_of_range(ms: str) -> bool:
    return len(ms) > 15 or int(ms) > MAX_DELAY_MS  # a huge digit string never reaches int()


def _dedup_of_row(value: object) -> None:
    if value not in ("keep", "replace"):
        raise InvalidTaskError(f"offer row has unknown dedup mode {value!r}")


def _check_due(kind: object, ms: object) -> None:
    if kind not in ("d", "a") or not isinstance(ms, int) or ms < 0:
        raise InvalidTaskError(f"row has a malformed due time ({kind!r}, {ms!r})")
    if (kind == "d" and ms > MAX_DELAY_MS) or (kind == "a" and ms > _EPOCH_MS_LIMIT):
        raise InvalidTaskError(f"row has a due time out of range ({kind!r}, {ms!r})")


def _check_envelope(data: bytes) -> None:
    """The envelope parses as one of the forms delayq writes. Only its structure is checked:
    a pickled payload is never loaded here (the relay must not run code from a table)."""
    try:
        if data[:1] == BARE:
            load_json(data[1:])
            return
        if data[:1] == b"{":
            doc = load_json(data)
        elif importlib.util.find_spec("msgpack") is None:
            return  # a relay without msgpack moves msgpack envelopes unread
        else:
            doc = load_msgpack(data)
    except DecodeError as exc:
        raise InvalidTaskError(f"offer row's envelope is unreadable: {exc}") from exc
    if not isinstance(doc, dict) or "p" not in doc:
        raise InvalidTaskError("offer row's envelope is not a delayq envelope")
