"""The task envelope: what is stored per task in the ``tasks`` hash (docs/storage.md).

A JSON envelope is an object ``{"p": payload, ...}``; a msgpack envelope is the same map
packed with msgpack and a ``"c": "msgpack"`` field. Optional fields appear only when set. The
common case, a JSON payload with no headers, priority, key or type, is stored bare: ``=``
followed by the payload's JSON, one byte over the payload. ``"v"``, the envelope version, is
written only from version 2 on: a missing ``"v"`` means 1.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..exceptions import DecodeError, EncodeError, PayloadTooLarge
from . import tracing
from .codecs import PayloadType, dump_json, dump_msgpack, load_json, load_msgpack

ENVELOPE_VERSION: Final = 1
# Marks the bare form: a JSON payload with no option set, stored as b"=" + its JSON (5 bytes
# less than {"p":...}). "=" cannot start a JSON envelope, and as msgpack it is an int, never
# an envelope map.
BARE: Final = b"="
# The first bytes a msgpack map can start with (fixmap, map 16, map 32): every msgpack
# envelope, on a queue of any codec.
MSGPACK_MAPS: Final = frozenset(bytes([b]) for b in [*range(0x80, 0x90), 0xDE, 0xDF])


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded task envelope."""

    payload: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    key: str | None = None
    type_tag: str | None = None


@dataclass(frozen=True, slots=True)
class EnvelopeCodec:
    """Encodes and decodes envelopes for one queue's codec and payload type."""

    codec: str = "json"
    payload_type: PayloadType | None = None
    max_bytes: int = 1 << 20

    def encode(
        self,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        priority: int = 0,
        key: str | None = None,
    ) -> bytes:
        headers = tracing.with_trace_context(headers)  # the offer's span, if any
        plain = not (headers or priority or key is not None)
        if plain and self.codec == "json" and self.payload_type is None:  # the common case
            return self._bare(payload)
        doc: dict[str, Any] = {}
        if self.payload_type is not None:
            # JSON and msgpack are checked on the encoded envelope below, pickle here
            doc["p"] = self.payload_type.dump(
                payload, keep_bytes=self.codec != "json", check=self.codec == "pickle"
            )
            doc["ty"] = self.payload_type.tag
            if self.payload_type.version != 1:
                doc["tv"] = self.payload_type.version
        else:
            doc["p"] = payload
        if headers:
            doc["h"] = dict(headers)
        if priority:
            doc["pr"] = priority
        if key is not None:
            doc["k"] = key
        if self.codec == "msgpack":
            doc["c"] = "msgpack"
        if self.payload_type is not None and self.codec != "pickle":
            data = self.payload_type.encode(doc, self.codec)
        elif self.codec == "json":
            data = dump_json(doc)
        elif self.codec == "msgpack":
            data = dump_msgpack(doc)
        else:
            try:
                pickled = pickle.dumps(doc.pop("p"), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # pickling fails with many exception types
                raise EncodeError(f"payload cannot be pickled: {exc}") from exc
            doc["c"] = "pickle"
            doc["p"] = base64.b64encode(pickled).decode()
            data = dump_json(doc)
        return self._checked(data)

    def plain_encoder(self) -> Callable[[Any], bytes]:
        """``encode`` for payloads with no options, as one call (bulk offers use it)."""
        if self.codec != "json" or self.payload_type is not None or tracing.active():
            return self.encode
        return self._bare

    def _bare(self, payload: Any) -> bytes:
        return self._checked(BARE + dump_json(payload))

    def _checked(self, data: bytes) -> bytes:
        if len(data) > self.max_bytes:
            raise PayloadTooLarge(
                f"encoded task is {len(data)} bytes, over the limit of {self.max_bytes} "
                "(max_payload_bytes)"
            )
        return data

    def _is_json(self, data: bytes) -> bool:
        """Whether to read ``data`` as JSON: it opens an object, or it opens no msgpack map
        and the queue writes JSON (a corrupt task then fails as JSON, its queue's codec)."""
        if data[:1] == b"{":
            return True
        return self.codec != "msgpack" and data[:1] not in MSGPACK_MAPS

    def decode(self, data: bytes) -> Envelope:
        if data[:1] == BARE:
            payload = load_json(data[1:])
            if self.payload_type is not None:
                payload = self.payload_type.load(payload, 1)
            return Envelope(payload)
        doc = load_json(data) if self._is_json(data) else load_msgpack(data)
        if not isinstance(doc, dict) or "p" not in doc:
            raise DecodeError("stored task is not a delayq envelope")
        version = doc.get("v", 1)
        if not isinstance(version, int) or version > ENVELOPE_VERSION:
            raise DecodeError(f"envelope version {version!r} is not one this delayq reads")
        payload = doc["p"]
        if doc.get("c") == "pickle":
            if self.codec != "pickle":
                raise DecodeError(
                    "task is pickled; only a queue created with codec='pickle' loads it"
                )
            try:
                payload = pickle.loads(base64.b64decode(payload))
            except Exception as exc:  # corrupt pickles raise anything
                raise DecodeError(f"pickled payload cannot be loaded: {exc}") from exc
        if self.payload_type is not None:
            type_version = doc.get("tv", 1)
            if not isinstance(type_version, int) or isinstance(type_version, bool):
                raise DecodeError(f"stored task has a malformed type version {type_version!r}")
            payload = self.payload_type.load(payload, type_version)
        headers = doc.get("h", {})
        priority = doc.get("pr", 0)
        if not isinstance(headers, dict) or not isinstance(priority, int):
            raise DecodeError("stored task has malformed headers or priority")
        return Envelope(payload, headers, priority, doc.get("k"), doc.get("ty"))
