"""Payload codecs and typed payloads.

JSON is the default: stored tasks stay readable in ``redis-cli`` and survive code changes.
msgpack is compact and optional. pickle runs arbitrary code on load, so a queue decodes it
only when it was created with ``codec="pickle"``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any, Final

from ..exceptions import ConfigError, DecodeError, EncodeError

CODECS: Final = ("json", "msgpack", "pickle")


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
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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


class PayloadType:
    """Turns instances of a dataclass or pydantic model into plain data and back.

    With pydantic installed, any type pydantic validates works (nested dataclasses, datetimes,
    models); without it, flat dataclasses do. A class may declare ``__delayq_version__ = N`` and
    a classmethod ``__delayq_upgrade__(data, from_version)`` to read tasks written by older code.
    """

    __slots__ = ("_adapter", "cls", "tag", "version")

    def __init__(self, cls: type) -> None:
        if not isinstance(cls, type):
            raise ConfigError(f"payload_type must be a class, not {cls!r}")
        self.cls = cls
        self.tag = f"{cls.__module__}.{cls.__qualname__}"
        self.version = int(getattr(cls, "__delayq_version__", 1))
        try:
            pydantic = importlib.import_module("pydantic")
            self._adapter: Any = pydantic.TypeAdapter(cls)
        except ImportError:
            if not dataclasses.is_dataclass(cls):
                raise ConfigError(
                    f"payload_type {self.tag} is not a dataclass; other types need pydantic"
                ) from None
            self._adapter = None

    def dump(self, obj: Any) -> Any:
        if not isinstance(obj, self.cls):
            raise EncodeError(f"payload must be a {self.tag}, got {type(obj).__name__}")
        if self._adapter is not None:
            return self._adapter.dump_python(obj, mode="json")
        return dataclasses.asdict(obj)  # type: ignore[call-overload]

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
            return self.cls(**data)
        except Exception as exc:  # validation errors of any kind mean the same thing here
            raise DecodeError(f"payload does not fit {self.tag}: {exc}") from exc
