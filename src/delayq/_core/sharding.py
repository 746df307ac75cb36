"""Sharded queues: one logical queue over N sub-queues, each under its own hash tag.

Pure planning: which hash tags the sub-queues get (spread over the cluster's slot space, so
that they spread over its masters), which sub-queue a task goes to, and how the shard count is
recorded. The queues in ``_async/sharded.py`` do the I/O.
"""

from __future__ import annotations

import binascii
import logging
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ..exceptions import ConfigError
from .keys import QueueKeys, validate_name
from .models import Stats
from .protocol import stats_from_reply
from .scripts import Op
from .text import printable

log = logging.getLogger("delayq")

SLOTS = 16384  # Redis Cluster's hash slots
MAX_SHARDS = 1024
# A sharded queue's name leaves room for the sub-queues' suffix within the 200-character limit.
MAX_SHARDED_NAME = 180


def key_slot(tag: str) -> int:
    """The cluster slot of a hash tag (CRC16-XMODEM modulo 16384, as Redis computes it)."""
    return binascii.crc_hqx(tag.encode(), 0) % SLOTS


def check_shards(shards: object) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}")
    return shards


def shard_names(name: str, shards: int) -> list[str]:
    """The sub-queue names of a logical queue: ``<name>~<i>.<salt>``, the salt being the
    first that puts sub-queue ``i``'s slot near the middle of the ``i``-th of ``shards`` equal
    slot ranges.
    Masters own ranges of slots, so the sub-queues spread over them as evenly as the count
    allows; every client computes the same names."""
    validate_name(name)
    if len(name) > MAX_SHARDED_NAME:
        raise ConfigError(f"a sharded queue's name has at most {MAX_SHARDED_NAME} characters")
    names = []
    for i in range(shards):
        # Near the middle of its range, not anywhere in it: a range that straddles two
        # masters' slots then goes to the master that owns most of it, whatever the name.
        low, high = i * SLOTS // shards, (i + 1) * SLOTS // shards
        middle, leeway = (low + high) / 2, max((high - low) / 8, 8)
        salt = 0
        while abs(key_slot(f"{name}~{i}.{salt}") + 0.5 - middle) > leeway:
            salt += 1
        names.append(f"{name}~{i}.{salt}")
    return names


def is_part_of(sub: str, name: str) -> bool:
    """Whether ``sub`` is queue ``name`` itself or one of its sub-queues."""
    if sub == name:
        return True
    shard, dot, salt = sub.removeprefix(f"{name}~").partition(".")
    return sub.startswith(f"{name}~") and shard.isdigit() and bool(dot) and salt.isdigit()


def shard_of(route: str, shards: int) -> int:
    """The shard of a routing value (a dedup key or a task id): stable across processes."""
    return zlib.crc32(route.encode("utf-8", "surrogatepass")) % shards


def id_for_shard(shard: int, shards: int, draw: Callable[[], str]) -> str:
    """A fresh id that routes to ``shard`` (about ``shards`` draws), so that a task routed
    by its dedup key is still found by its id alone."""
    while True:
        task_id = draw()
        if shard_of(task_id, shards) == shard:
            return task_id


@dataclass(frozen=True, slots=True)
class Layout:
    """How a queue's tasks are laid out, as Redis records it: ``shards`` sub-queues, and,
    while a reshard is under way, the ``previous`` layout that consumers still drain (0 is an
    unsharded queue, under its own name)."""

    shards: int
    previous: int | None = None

    def encode(self) -> str:
        return str(self.shards) if self.previous is None else f"{self.shards}<{self.previous}"

    def names(self, name: str) -> list[str]:
        """Every sub-queue holding the queue's tasks: the current layout's, then the previous
        one's."""
        names = shard_names(name, self.shards)
        if self.previous is not None:
            names += [name] if self.previous == 0 else shard_names(name, self.previous)
        return names


def layout_names(name: str, layout: Layout | None) -> tuple[list[str], list[str]]:
    """The (sub-)queue names of a queue's current layout and of the previous one (empty but
    during a reshard); an unsharded queue is one shard under its own name."""
    if layout is None:
        return [name], []
    names = layout.names(name)
    return names[: layout.shards], names[layout.shards :]


def describe(layout: Layout | None) -> str:
    """A layout in words, for messages."""
    if layout is None:
        return "unsharded"
    text = f"{layout.shards} shard{'s' if layout.shards != 1 else ''}"
    if layout.previous is not None:
        was = "unsharded" if layout.previous == 0 else f"{layout.previous} shards"
        text += f" (resharding from {was})"
    return text


_RECORDED: Final = re.compile(r"([0-9]{1,4})(?:<([0-9]{1,4}))?")


def recorded_layout(value: object, name: str = "") -> Layout | None:
    """The layout stored in Redis for a queue (``None`` if none is: an unsharded queue).
    A value delayq never writes (not ``N`` or ``N<M``, a count out of range, bytes that are
    not text) is a :class:`ConfigError` naming the queue: guessing would route its tasks
    where no consumer looks, and a huge count would hang every reader."""
    if value is None:
        return None
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    found = _RECORDED.fullmatch(raw.decode("ascii", errors="replace"))
    current = int(found.group(1)) if found else 0
    previous = int(found.group(2)) if found and found.group(2) is not None else None
    if not found or not 1 <= current <= MAX_SHARDS or (previous or 0) > MAX_SHARDS:
        shown = raw[:40].decode("ascii", errors="backslashreplace")
        raise ConfigError(
            f"queue {name!r} has a malformed layout record {shown!r} in Redis (expected N or "
            f"N<M, shard counts up to {MAX_SHARDS}); fix it with HSET <prefix>:shards"
        )
    return Layout(current, previous)


def shards_key(prefix: str) -> str:
    """The hash of logical queue name -> shard count (outside any queue's slot, like the
    registry: written by clients, never by scripts)."""
    return f"{prefix}:shards"


def _pause_end(parts: Sequence[Stats]) -> datetime | None:
    """When the last paused shard's pause ends; None while one is paused until resumed."""
    ends = [p.paused_until for p in parts if p.paused]
    return None if not ends or None in ends else max(e for e in ends if e is not None)


def _summed(maps: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for values in maps:
        total.update(values)
    return dict(total)


def _top(values: dict[str, int], most: int) -> dict[str, int]:
    """The ``most`` largest of ``values`` (ties by key), as the stats script bounds them."""
    return dict(sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:most])


def merged_stats(name: str, parts: Sequence[Stats]) -> Stats:
    """The stats of a logical queue from its shards' (each read atomically on its own)."""
    counters: Counter[str] = Counter()
    lateness: Counter[float] = Counter()
    for part in parts:
        counters.update(part.counters)
        lateness.update(part.lateness)
    dues = [p.next_due_at for p in parts if p.next_due_at is not None]
    seen = [p.consumer_seen_at for p in parts if p.consumer_seen_at is not None]
    return Stats(
        queue=name,
        delayed=sum(p.delayed for p in parts),
        ready=sum(p.ready for p in parts),
        inflight=sum(p.inflight for p in parts),
        dead=sum(p.dead for p in parts),
        overdue=sum(p.overdue for p in parts),
        oldest_overdue_age=max((p.oldest_overdue_age for p in parts), default=0.0),
        next_due_at=min(dues) if dues else None,
        counters=dict(counters),
        lateness=dict(sorted(lateness.items())),
        lateness_sum=sum(p.lateness_sum for p in parts),
        consumer_seen_at=max(seen) if seen else None,
        shards=tuple(parts),
        expired=sum(p.expired for p in parts),
        # a sharded queue is paused (and resumed) shard by shard: paused while any shard is
        paused=any(p.paused for p in parts),
        paused_until=_pause_end(parts),
        limit_waiting=_summed(p.limit_waiting for p in parts),
        limit_running=_summed(p.limit_running for p in parts),
        limit_throttled={
            reason: _top(_summed(p.limit_throttled.get(reason, {}) for p in parts), 10)
            for reason in sorted({r for p in parts for r in p.limit_throttled})
        },
    )


def layouts_of(raw: dict[Any, Any], broken: dict[str, str] | None = None) -> dict[str, Layout]:
    """Queue name -> layout, from the recorded shard counts (an HGETALL of shards_key). A
    malformed record is that queue's error alone: left out, its error put in ``broken`` (or
    logged)."""
    layouts = {}
    for name, value in raw.items():
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        try:
            layout = recorded_layout(value, text)
        except ConfigError as exc:
            if broken is None:
                log.warning("delayq: %s", printable(str(exc)))
            else:
                broken[text] = str(exc)
            continue
        if layout is not None:
            layouts[text] = layout
    return layouts


class StatsPlan:
    """Reading the stats of many queues in one round: a sharded queue's shards (a reshard's
    previous ones included) are read beside the others and summed back into one Stats."""

    def __init__(
        self, prefix: str, names: Sequence[str], layouts: dict[str, Layout], overdue_ms: int
    ) -> None:
        self.names = list(names)
        self._layouts = layouts
        # Each sub-queue once: close counts share one (4 and 5 shards of a queue: ``~0.3``).
        self._parts = {
            n: list(dict.fromkeys(layouts[n].names(n))) if n in layouts else [n] for n in self.names
        }
        self.calls: list[tuple[Any, tuple[str, ...], list[Any]]] = [
            (Op.STATS, QueueKeys(prefix, sub).all, [overdue_ms])
            for name in self.names
            for sub in self._parts[name]
        ]

    def stats(self, replies: Sequence[Any]) -> list[Stats]:
        """The Stats of every name, in order, from the replies of :attr:`calls` (raises the
        first error reply)."""
        replies_left = iter(replies)
        result = []
        for name in self.names:
            read = []
            for sub in self._parts[name]:
                reply = next(replies_left)
                if isinstance(reply, Exception):
                    raise reply
                read.append(stats_from_reply(sub, reply))
            result.append(merged_stats(name, read) if name in self._layouts else read[0])
        return result
