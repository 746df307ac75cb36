"""Payload codecs and typed payloads.

JSON is the default: stored tasks stay readable in ``redis-cli`` and survive code changes.
msgpack is compact and optional. Untyped payloads are encoded strictly (a value JSON or msgpack
cannot hold, such as a set or a datetime, is an EncodeError rather than coming back as something
else); typed payloads are turned into plain data by msgspec (or pydantic, for its models).
pickle runs arbitrary code on load, so a queue decodes it only when it was created with
``codec="pickle"``.
"""

from __future__ import annotations

import importlib
import json
import re
from typing import TYPE_CHECKING, Any, Final

import msgspec
import msgspec.inspect
import msgspec.json
import msgspec.msgpack

from ..exceptions import ConfigError, DecodeError, EncodeError

CODECS: Final = ("json", "msgpack", "pickle")

# The payload type of a queue and its tasks: the class given as ``payload_type``, else Any.
# The default (PEP 696) is for type checkers only: Python 3.11's TypeVar has none, and it does
# nothing at run time.
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    PayloadT = TypeVar("PayloadT", default=Any)
else:
    from typing import TypeVar

    PayloadT = TypeVar("PayloadT")


def check_codec(codec: object) -> str:
    """Return ``codec`` if delayq knows it and its library is installed."""
    if codec not in CODECS:
        raise ConfigError(f"unknown codec {codec!r}: choose one of {', '.join(CODECS)}")
    if codec == "msgpack":
        _msgpack()
    return str(codec)


def _msgpack() -> Any:
    try:
        return importlib.import_module("msgpack")
    except ImportError as exc:
        raise ConfigError(
            "codec 'msgpack' needs the msgpack package: pip install delayq[msgpack]"
        ) from exc


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dump_json(obj: Any) -> bytes:
    try:
        return _JSON.encode(obj).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(f"payload is not JSON-serializable: {exc}") from exc


def load_json(data: bytes) -> Any:
    # msgspec reads JSON into the same values as json.loads (big ints exact), ~5x faster
    try:
        return msgspec.json.decode(data)
    except (ValueError, RecursionError) as exc:  # msgspec.DecodeError is a ValueError
        raise DecodeError(f"stored task is not valid JSON: {exc}") from exc


def dump_msgpack(obj: Any) -> bytes:
    try:
        return bytes(_msgpack().packb(obj, use_bin_type=True))
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise EncodeError(f"payload is not msgpack-serializable: {exc}") from exc


def load_msgpack(data: bytes) -> Any:
    try:
        msgpack = _msgpack()
    except ConfigError as exc:
        raise DecodeError(str(exc)) from exc
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"stored task is not valid msgpack: {exc}") from exc


_ENVELOPE_PATH: Final = re.compile(r"`\$\.p(?=[.\[`])")

# Parts of a type that msgspec cannot turn into plain data and back on its own.
_OPAQUE: Final = (msgspec.inspect.CustomType, msgspec.inspect.ExtType, msgspec.inspect.RawType)


def _opaque_parts(cls: type) -> list[type]:
    """The classes inside ``cls`` that msgspec cannot round-trip (they need pydantic or are
    refused); raises ConfigError for a type msgspec rejects outright (e.g. ambiguous unions)."""
    try:
        root = msgspec.inspect.type_info(cls)
    except TypeError as exc:
        raise ConfigError(f"payload_type {_tag(cls)} cannot be stored: {exc}") from exc
    found: list[type] = []
    seen: set[int] = set()
    todo: list[Any] = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:  # recursive types share their nodes
            continue
        seen.add(id(node))
        if isinstance(node, _OPAQUE):
            found.append(getattr(node, "cls", type(node)))
            continue
        todo += [f.type for f in getattr(node, "fields", ())]
        todo += getattr(node, "types", ()) + getattr(node, "item_types", ())
        todo += [
            getattr(node, a) for a in ("item_type", "key_type", "value_type") if hasattr(node, a)
        ]
    return found


def _str_subclass(obj: Any) -> Any:
    """msgspec takes exact ``str`` only: a :class:`TaskId` (or any str subclass) in a payload
    is stored as its text."""
    if isinstance(obj, str):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} values cannot be stored")


def _tag(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _pydantic_adapter(cls: type, opaque: list[type]) -> Any:
    names = ", ".join(sorted({_tag(c) for c in opaque}))
    try:
        pydantic = importlib.import_module("pydantic")
    except ImportError:
        raise ConfigError(
            f"payload_type {_tag(cls)} cannot be stored: msgspec cannot round-trip {names} "
            "(dataclasses, TypedDicts, NamedTuples, msgspec Structs, enums, datetime, UUID "
            "and Decimal fields work; pydantic models need pip install delayq[typed])"
        ) from None
    try:
        return pydantic.TypeAdapter(cls)
    except Exception as exc:  # pydantic's schema errors have several types
        raise ConfigError(
            f"payload_type {_tag(cls)} cannot be stored: neither msgspec nor pydantic can "
            f"round-trip {names}: {exc}"
        ) from exc


class PayloadType:
    """Turns instances of a typed class into plain data (JSON values) and back.

    msgspec does the work, whatever else is installed: dataclasses, TypedDicts, NamedTuples and
    msgspec Structs, nested to any depth, with ``datetime``, ``date``, ``time``, ``timedelta``,
    ``UUID``, ``Decimal``, enum, ``bytes``, set and tuple fields. Pydantic models (and classes
    holding them) go through pydantic when it is installed. A type neither can round-trip is
    refused here, with a :class:`ConfigError`. Parts annotated ``Any`` hold plain data, as on an
    untyped queue. A class may declare ``__delayq_version__ = N`` and a classmethod
    ``__delayq_upgrade__(data, from_version)`` to read tasks written by older code.
    """

    __slots__ = ("_adapter", "_is_typeddict", "_readers", "cls", "tag", "version")

    def __init__(self, cls: type) -> None:
        if not isinstance(cls, type):
            raise ConfigError(f"payload_type must be a class, not {cls!r}")
        self.cls = cls
        self.tag = _tag(cls)
        self.version = int(getattr(cls, "__delayq_version__", 1))
        opaque = _opaque_parts(cls)
        self._adapter: Any = _pydantic_adapter(cls, opaque) if opaque else None
        # isinstance() refuses TypedDicts: their instances are plain dicts, checked by msgspec
        self._is_typeddict = isinstance(
            msgspec.inspect.type_info(cls), msgspec.inspect.TypedDictType
        )
        # Read an envelope's payload straight into the type, in one pass (check_stored)
        stored = msgspec.defstruct("StoredPayload", [("p", cls)])
        self._readers: dict[str, Any] = (
            {}
            if self._adapter is not None
            else {"json": msgspec.json.Decoder(stored), "msgpack": msgspec.msgpack.Decoder(stored)}
        )

    def dump(self, obj: Any, *, keep_bytes: bool = False, check: bool = True) -> Any:
        """Plain data for ``obj``; ``keep_bytes`` leaves bytes as bytes (binary codecs), else
        they become base64 text. Raises EncodeError unless the data reads back as the type
        (``check=False``: the caller checks the encoded envelope, :meth:`check_stored`)."""
        if not isinstance(obj, dict if self._is_typeddict else self.cls):
            raise EncodeError(f"payload must be a {self.tag}, got {type(obj).__name__}")
        if self._adapter is not None:
            return self._adapter.dump_python(obj, mode="json")
        try:
            data = msgspec.to_builtins(
                obj,
                builtin_types=(bytes, bytearray) if keep_bytes else None,
                enc_hook=_str_subclass,
            )
            if check:  # else the caller checks the encoded envelope (check_stored)
                msgspec.convert(data, self.cls)
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            raise EncodeError(f"payload does not fit {self.tag}: {exc}") from exc
        return data

    def encode(self, doc: dict[str, Any], codec: str) -> bytes:
        """``doc``, an envelope whose ``"p"`` is ``dump(..., check=False)``, as checked JSON
        or msgpack (the same maps as before, readable by any msgpack library). msgspec writes
        either faster than json.dumps or msgpack.packb; it writes a NaN as JSON null, which
        the check catches."""
        write = msgspec.json.encode if codec == "json" else msgspec.msgpack.encode
        try:
            data = write(doc, enc_hook=_str_subclass)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"payload does not fit {self.tag} as {codec}: {exc}") from exc
        self.check_stored(data, codec)
        return data

    def check_stored(self, data: bytes, codec: str) -> None:
        """Raise EncodeError unless the payload of the encoded envelope ``data`` reads back as
        the type: a field of the wrong type fails the offer, not a delivery hours later."""
        try:
            if self._adapter is None:
                self._readers[codec].decode(data)
            elif codec == "json":  # pydantic checked its model; JSON may still lose a NaN
                self._adapter.validate_python(msgspec.json.decode(data)["p"])
        except Exception as exc:  # validation errors of every library and kind
            # The path msgspec names is in the envelope ($.p.order_id); the caller's is in
            # the payload they gave ($.order_id).
            reason = _ENVELOPE_PATH.sub("`$", str(exc))
            raise EncodeError(f"payload does not fit {self.tag} as {codec}: {reason}") from exc

    def load(self, data: Any, version: int) -> Any:
        if version != self.version:
            upgrade = getattr(self.cls, "__delayq_upgrade__", None)
            if version > self.version or upgrade is None:
                raise DecodeError(
                    f"task has {self.tag} version {version}, this code reads version "
                    f"{self.version} (define __delayq_upgrade__ to migrate)"
                )
            try:
                data = upgrade(data, version)
            except Exception as exc:  # a hook failing on old data: the task is undecodable
                raise DecodeError(f"__delayq_upgrade__ of {self.tag} failed: {exc!r}") from exc
        try:
            if self._adapter is not None:
                return self._adapter.validate_python(data)
            return msgspec.convert(data, self.cls)
        except Exception as exc:  # validation errors of any kind mean the same thing here
            raise DecodeError(f"payload does not fit {self.tag}: {exc}") from exc
