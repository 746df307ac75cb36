"""The queue registry, read: which queues Redis lists under a prefix and how each is laid out.

Redis keeps two records per prefix, written by clients only (never by scripts): the set
``<prefix>:queues`` of every queue ever offered to or created, and the hash
``<prefix>:shards`` of the sharded queues' layouts (``sharding.shards_key``). The connection
handle (``_async/connection.py``) reads them with two commands; this module turns the replies
into names, so that the CLI, the dashboard and the exporter read them alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ConfigError
from .keys import QueueKeys
from .sharding import Layout, layouts_of


def registry_key(prefix: str) -> str:
    """The set of queue names under ``prefix`` (raises :class:`ConfigError` for a bad one)."""
    return QueueKeys(prefix, "x").registry


def member_text(member: object) -> str:
    """A registry member as text: undecodable bytes escaped (``\\xff``), never lost."""
    if isinstance(member, bytes | bytearray | memoryview):
        return bytes(member).decode(errors="backslashreplace")
    return str(member)


@dataclass(frozen=True, slots=True)
class Registry:
    """The queues Redis lists under ``prefix``, as read at one moment.

    ``names``: the valid queue names, sorted; ``invalid``: members that are no queue name
    (written by something else), as text, sorted; ``members``: the raw members, as stored
    (to remove one exactly); ``layouts``: the recorded layout of each sharded queue (a queue
    absent from it is unsharded); ``broken``: queue -> the error of its malformed layout
    record (such a queue is in neither ``names`` nor ``layouts``: nobody can route it)."""

    prefix: str
    names: tuple[str, ...]
    invalid: tuple[str, ...] = ()
    members: tuple[bytes, ...] = ()
    layouts: Mapping[str, Layout] = field(default_factory=dict)
    broken: Mapping[str, str] = field(default_factory=dict)

    def shard_counts(self) -> dict[str, int]:
        """Queue name -> its current shard count, for the sharded queues."""
        return {name: layout.shards for name, layout in self.layouts.items()}


def read_registry(
    prefix: str, members: Iterable[Any], layouts: Mapping[Any, Any] | None = None
) -> Registry:
    """The registry from the replies of ``SMEMBERS <prefix>:queues`` and, if read,
    ``HGETALL <prefix>:shards``."""
    registry_key(prefix)  # validates the prefix
    raw = sorted({bytes(m) if not isinstance(m, str) else m.encode() for m in members})
    valid, invalid = set(), set()
    for member in raw:
        text = member_text(member)
        try:
            valid.add(QueueKeys(prefix, text).name)
        except ConfigError:
            invalid.add(text)
    broken: dict[str, str] = {}
    found = layouts_of(dict(layouts), broken) if layouts else {}
    return Registry(
        prefix,
        tuple(sorted(valid - set(broken))),
        tuple(sorted(invalid)),
        tuple(raw),
        found,
        broken,
    )
