"""The pure part of moving a Redisson ``RDelayedQueue`` into a delayq queue: each member read
becomes the arguments of a move script (a task, or a dead letter that keeps its raw bytes),
the scripts' replies become counts, and the counts a summary a team pastes into its ticket.

The scripts (``lua/redisson_*.lua``) decide atomically what is still there to move; this side
only decodes, so a member that changed between the read and the script is skipped, never
moved twice.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..exceptions import DelayqError
from .envelope import EnvelopeCodec
from .redisson import (
    CLASS_HEADER,
    MemberFormat,
    RedissonCodec,
    decode_value,
    migrated_id,
    unpack_member,
)
from .timing import format_duration

ERROR_HEADER = "redisson-error"
SOURCE_HEADER = "redisson-source"
_CLAIM_ENTRY = struct.Struct(">dI")
# A dead letter keeps the raw bytes even when they are over the queue's payload limit.
_DEAD_LETTERS = EnvelopeCodec("json", None, 1 << 62)


class Source(StrEnum):
    """Where in Redisson a batch is read: the scripts' first argument."""

    PENDING = "p"  # the delayed members (ZSET + LIST)
    READY = "r"  # the destination list: due values, not yet taken by a Java consumer


class Status(StrEnum):
    """What a move script did with one member (one digit of its reply)."""

    GONE = "0"  # not there any more: a Redisson client or another mover took it first
    MOVED = "1"
    DEAD = "2"  # undecodable: dead-lettered in delayq with its raw bytes
    TAKEN = "3"  # the delayq id is taken: left where it was


@dataclass(frozen=True, slots=True)
class Prepared:
    """One member read from Redisson, ready for a move script."""

    raw: bytes  # as stored in Redisson: the script finds it by these bytes
    task_id: str
    envelope: bytes
    error: str  # '' for a task; else why it is dead-lettered
    format: MemberFormat | None  # None: a ready value (bare codec bytes) or undecodable
    due_ms: int | None = None  # known only after a claim (the ZSET score)

    def move_fields(self) -> list[Any]:
        return [self.raw, self.task_id, self.envelope, self.error]

    def land_fields(self) -> list[Any]:
        due = "" if self.due_ms is None or self.due_ms < 0 else self.due_ms
        return [self.task_id, due, self.envelope, self.error]


@dataclass(frozen=True, slots=True)
class Decoding:
    """How members become tasks: Redisson's codec, the queue's envelope, what to keep."""

    codec: RedissonCodec
    envelope: EnvelopeCodec
    keep_class: bool = True

    def pending(self, raw: bytes) -> Prepared:
        """A member of the ZSET/LIST: its id comes from Redisson's random id."""
        try:
            member = unpack_member(raw)
        except DelayqError as exc:
            task_id = "rdq-bad-" + hashlib.sha1(raw).hexdigest()[:16]
            return self._dead(raw, task_id, Source.PENDING, str(exc))
        return self._task(raw, member.value, migrated_id(member), Source.PENDING, member.format)

    def ready(self, raw: bytes, batch: str, index: int) -> Prepared:
        """A value of the destination list (no id of its own: named after its batch)."""
        return self._task(raw, raw, f"rdq-r-{batch}-{index}", Source.READY, None)

    def _task(
        self, raw: bytes, value: bytes, task_id: str, source: Source, fmt: MemberFormat | None
    ) -> Prepared:
        try:
            decoded = decode_value(value, self.codec, keep_class=self.keep_class)
            headers = {CLASS_HEADER: decoded.java_class} if decoded.java_class else None
            envelope = self.envelope.encode(decoded.payload, headers=headers)
        except DelayqError as exc:
            return self._dead(raw, task_id, source, f"{exc} ({len(value)} bytes)")
        return Prepared(raw, task_id, envelope, "", fmt)

    def _dead(self, raw: bytes, task_id: str, source: Source, error: str) -> Prepared:
        text = f"Redisson {source.name.lower()} member not migrated: {error}"
        envelope = _DEAD_LETTERS.encode(
            {"raw_base64": base64.b64encode(raw).decode()},
            headers={ERROR_HEADER: text, SOURCE_HEADER: source.name.lower()},
        )
        return Prepared(raw, task_id, envelope, text, None)


def move_args(source: Source, items: Sequence[Prepared]) -> list[Any]:
    """The arguments of ``redisson_move.lua``."""
    args: list[Any] = [source.value]
    for item in items:
        args += item.move_fields()
    return args


def land_args(receipt_ms: int, items: Sequence[Prepared]) -> list[Any]:
    """The arguments of ``redisson_land.lua``."""
    args: list[Any] = [receipt_ms]
    for item in items:
        args += item.land_fields()
    return args


def statuses(reply: Any) -> list[Status]:
    """A move or land script's reply (a string of digits) as statuses."""
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return [Status(ch) for ch in text if ch != "-"]


def claimed(blob: bytes) -> list[tuple[int, bytes]]:
    """The (due ms, or -1 for a ready value; raw bytes) entries of a claim
    (``redisson_claim.lua``)."""
    entries, at = [], 0
    while at < len(blob):
        due, length = _CLAIM_ENTRY.unpack_from(blob, at)
        at += _CLAIM_ENTRY.size
        entries.append((int(due), blob[at : at + length]))
        at += length
    return entries


@dataclass(slots=True)
class Counts:
    """What a migration did so far."""

    moved: int = 0
    dead_lettered: int = 0
    gone: int = 0  # taken by a Redisson client (its timer or a consumer) before us
    conflicts: int = 0  # delayq ids taken: not written (left in Redisson on the atomic path)
    batches: int = 0
    by_format: dict[str, int] = field(default_factory=dict)

    def add(self, items: Sequence[Prepared], done: Sequence[Status]) -> int:
        """Count one batch's statuses; how many members left Redisson."""
        self.batches += 1
        left = 0
        for item, status in zip(items, done, strict=True):
            if status is Status.MOVED:
                self.moved += 1
                kind = item.format.value if item.format else "ready list"
                self.by_format[kind] = self.by_format.get(kind, 0) + 1
            elif status is Status.DEAD:
                self.dead_lettered += 1
            elif status is Status.GONE:
                self.gone += 1
            else:
                self.conflicts += 1
            left += status in (Status.MOVED, Status.DEAD)
        return left


@dataclass(frozen=True, slots=True)
class Backlog:
    """What a Redisson queue holds now."""

    pending: int  # ZSET members (due or not)
    listed: int  # LIST members (the same members, in offer order)
    ready: int  # values in the destination list
    claimed: int  # batches claimed by an interrupted cross-slot move
    due_now: int
    first_due_ms: int | None
    last_due_ms: int | None

    @property
    def empty(self) -> bool:
        return not (self.pending or self.listed or self.ready or self.claimed)


@dataclass(frozen=True, slots=True)
class Summary:
    """The outcome of a migration run: :meth:`text` is the block for the change ticket."""

    source: str
    target: str
    path: str
    started_at: str  # ISO 8601 UTC
    elapsed_s: float
    counts: Counts
    before: Backlog
    after: Backlog

    @property
    def rate(self) -> float:
        """Members taken out of Redisson per second."""
        taken = self.counts.moved + self.counts.dead_lettered
        return taken / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def text(self) -> str:
        c, b, a = self.counts, self.before, self.after
        formats = ", ".join(f"{k}: {v:,}" for k, v in sorted(c.by_format.items())) or "none"
        lines = [
            f"Redisson RDelayedQueue {self.source!r} -> delayq queue {self.target!r}",
            f"  started         {self.started_at}, ran {format_duration(self.elapsed_s)}",
            f"  move            {self.path}",
            f"  before          {b.pending:,} delayed, {b.ready:,} ready in the list",
            f"  moved           {c.moved:,} tasks ({formats}), {self.rate:,.0f}/s over the run",
            f"  dead-lettered   {c.dead_lettered:,} (undecodable, raw bytes kept)",
            f"  taken by Java   {c.gone:,} (a Redisson timer or consumer got there first)",
            f"  left            {a.pending:,} delayed, {a.ready:,} ready, {a.claimed:,} claims",
        ]
        if c.conflicts:
            lines.append(
                f"  id taken        {c.conflicts:,} (a delayq task has that id: not written "
                "again; see 'left')"
            )
        return "\n".join(lines)
