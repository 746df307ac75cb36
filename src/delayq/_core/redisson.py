"""Redisson's ``RDelayedQueue`` storage, as its source (``RedissonDelayedQueue.java``) writes
it: key names, the two member formats and the two codecs delayq reads and writes.

For a destination queue ``NAME`` Redisson keeps, all in the slot of ``NAME``:

- ``redisson_delay_queue_timeout:{NAME}``: a ZSET of packed members, score = due epoch ms
  from the offering client's clock;
- ``redisson_delay_queue:{NAME}``: a LIST of the same members, in offer order;
- ``NAME``: the destination LIST of bare codec bytes that Java consumers ``BLPOP``;
- ``redisson_delay_queue_channel:{NAME}``: the channel an offer publishes a new head's due
  time on (decimal ms), which wakes every client's transfer timer.

A member packs the codec's bytes with a random id, in native byte order (x86-64 and arm64
are both little-endian, so ``<`` here): since Redisson 3.21.1 ``struct.pack('Bc0Lc0', 8, id,
len(value), value)`` (a 1-byte id length, 8 random bytes, an 8-byte value length, the value),
before it ``struct.pack('dLc0', random_double, len(value), value)``.

Pure: no I/O, so the emulation in the tests, the Python producer and the migration share it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..exceptions import ConfigError, DecodeError

_LENGTH = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
ID_BYTES = 8  # Redisson's generateIdArray(8)
CLASS_PROPERTY = "@class"  # where JsonJacksonCodec's default typing puts the Java class
CLASS_HEADER = "redisson-class"  # the delayq header a migrated task keeps it in


class MemberFormat(StrEnum):
    """How a member of Redisson's ZSET and LIST is packed."""

    CURRENT = "3.21.1+"  # 'Bc0Lc0': id length, 8 random bytes, value length, value
    LEGACY = "pre-3.21.1"  # 'dLc0': a random double, value length, value


class RedissonCodec(StrEnum):
    """The Redisson codecs delayq reads and writes."""

    STRING = "string"  # org.redisson.client.codec.StringCodec: UTF-8 text
    JSON_JACKSON = "json-jackson"  # org.redisson.codec.JsonJacksonCodec: JSON, '@class' typed


def codec_of(name: object) -> RedissonCodec:
    """The codec called ``name``, or a :class:`ConfigError` naming the ones there are."""
    try:
        return RedissonCodec(str(name))
    except ValueError:
        known = ", ".join(c.value for c in RedissonCodec)
        raise ConfigError(f"unknown Redisson codec {name!r}: use one of {known}") from None


def prefixed(prefix: str, name: str) -> str:
    """Redisson's ``prefixName``: a name with a hash tag of its own keeps it."""
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


@dataclass(frozen=True, slots=True)
class RedissonKeys:
    """The keys of the Redisson delayed queue whose destination list is ``name``."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"invalid Redisson queue name {self.name!r}")

    @property
    def timeouts(self) -> str:
        """ZSET member -> due epoch ms."""
        return prefixed("redisson_delay_queue_timeout", self.name)

    @property
    def members(self) -> str:
        """LIST of members in offer order."""
        return prefixed("redisson_delay_queue", self.name)

    @property
    def destination(self) -> str:
        """LIST of due values (bare codec bytes) that consumers ``BLPOP``."""
        return self.name

    @property
    def channel(self) -> str:
        """The channel that announces a new earliest due time."""
        return prefixed("redisson_delay_queue_channel", self.name)

    @property
    def claims(self) -> str:
        """delayq's own HASH, in Redisson's slot: batches taken out of Redisson but not yet
        confirmed written to a delayq queue in another slot (``migrate`` across slots)."""
        return prefixed("redisson_delay_queue_delayq_claims", self.name)

    @property
    def all(self) -> tuple[str, str, str]:
        """The keys the move scripts take, in their order."""
        return (self.timeouts, self.members, self.destination)


def pack_member(value: bytes, fmt: MemberFormat = MemberFormat.CURRENT) -> bytes:
    """A new member holding ``value`` with a fresh random id, as Redisson's offer packs it."""
    if fmt is MemberFormat.CURRENT:
        return bytes([ID_BYTES]) + os.urandom(ID_BYTES) + _LENGTH.pack(len(value)) + value
    random_double = _DOUBLE.pack(float(int.from_bytes(os.urandom(7), "little")))
    return random_double + _LENGTH.pack(len(value)) + value


@dataclass(frozen=True, slots=True)
class Member:
    """An unpacked member: its format, its random id's bytes, the codec's bytes."""

    format: MemberFormat
    random_id: bytes
    value: bytes


def _fits(member: bytes, at: int) -> bool:
    if len(member) < at + _LENGTH.size:
        return False
    (length,) = _LENGTH.unpack_from(member, at)
    return bool(len(member) == at + _LENGTH.size + length)


def unpack_member(member: bytes) -> Member:
    """The parts of a member in either format; :class:`DecodeError` if it is neither (the
    lengths inside must account for every byte)."""
    if member[:1] == bytes([ID_BYTES]) and _fits(member, 1 + ID_BYTES):
        start = 1 + ID_BYTES + _LENGTH.size
        return Member(MemberFormat.CURRENT, member[1 : 1 + ID_BYTES], member[start:])
    if _fits(member, _DOUBLE.size):
        start = _DOUBLE.size + _LENGTH.size
        return Member(MemberFormat.LEGACY, member[: _DOUBLE.size], member[start:])
    raise DecodeError(
        f"a Redisson member of {len(member)} bytes unpacks as neither 'Bc0Lc0' (3.21.1+) "
        "nor 'dLc0' (before): its length fields do not match its size"
    )


def encode_value(value: Any, codec: RedissonCodec, java_class: str | None = None) -> bytes:
    """The bytes Redisson's codec writes for ``value``. StringCodec takes a ``str``;
    JsonJacksonCodec any JSON value, with ``java_class`` as its ``@class`` (an object only:
    that is where Jackson's default typing puts it)."""
    if codec is RedissonCodec.STRING:
        if not isinstance(value, str):
            raise TypeError(f"StringCodec stores text: got {type(value).__name__}")
        return value.encode()
    if java_class is not None:
        if not isinstance(value, dict):
            raise TypeError("java_class needs an object (a dict) to carry '@class'")
        value = {CLASS_PROPERTY: java_class, **value}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Decoded:
    """A value read through a codec: the payload and, for Jackson, its top-level Java class."""

    payload: Any
    java_class: str | None = None


def decode_value(data: bytes, codec: RedissonCodec, *, keep_class: bool = True) -> Decoded:
    """The payload Redisson's codec wrote; :class:`DecodeError` if the bytes are not what that
    codec writes. With ``keep_class`` False a top-level ``@class`` is dropped, else returned
    apart from the payload (a migrated task keeps it as a header)."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(f"value is not UTF-8 ({codec.value} codec): {exc}") from exc
    if codec is RedissonCodec.STRING:
        return Decoded(text)
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise DecodeError(f"value is not JSON (json-jackson codec): {exc}") from exc
    java_class = None
    if isinstance(payload, dict) and isinstance(payload.get(CLASS_PROPERTY), str):
        java_class = payload.pop(CLASS_PROPERTY)
    return Decoded(payload, java_class if keep_class else None)


def migrated_id(member: Member) -> str:
    """The delayq id of a migrated member: its random id in hex, so that the same member
    always gets the same id and a task can be traced back to the member it was."""
    return "rdq-" + member.random_id.hex()
