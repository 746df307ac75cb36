"""Applying claimed rows to Redis exactly once: each row's apply id goes with it to the script
that applies it (offer, cancel, reschedule), which records it in the shard's applied set in
the same atomic step and refuses it afterwards (lua/_lib.lua, "Outbox receipts").

A receipt lives ``retention`` while its row may still be claimed again (the relay wrote and
has not committed). Once the row's DELETE committed nobody can claim it, and :meth:`settle`
shortens its receipt to ``settle_s``: long enough for a call of a relay whose session was cut
to reach Redis late, short enough that receipts cost memory only for the rows in flight.

Rows are routed by the layout Redis records for their queue (``AsyncDelayQueue._routes``):
unsharded, sharded, or both layouts while a reshard is under way.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Final

from .._async.queue import AsyncDelayQueue
from .._async.shard import AsyncShard
from .._core import protocol
from .._core.limits import check_same_shard
from .._core.models import DedupMode
from .._core.protocol import OfferSpec
from .._core.scripts import Op
from ..exceptions import ServerError
from ._rows import Claimed

APPLIED_ROLE: Final = "applied"  # the shard's ZSET apply id -> ms until its receipt expires
DEFAULT_RETENTION_S: Final = 24 * 3600.0
DEFAULT_SETTLE_S: Final = 120.0
# Offer statuses of the offer script (offer.lua); APPLIED_BEFORE only for outbox rows.
CONFLICT: Final = 3
APPLIED_BEFORE: Final = 4


class Outcome(StrEnum):
    """What applying a cancel or reschedule row did."""

    APPLIED = "applied"
    MISSING = "missing"  # no waiting task had the id: nothing was cancelled or moved
    DUPLICATE = "duplicate"  # the row was applied before (its receipt refused it)


class Receipts:
    """The receipts of one relay: how long they are kept, and those to settle at commit."""

    def __init__(self, retention_s: float, settle_s: float) -> None:
        self.keep_ms = int(retention_s * 1000)
        self.settle_ms = int(settle_s * 1000)
        self._written: dict[AsyncShard, list[str]] = {}

    def _note(self, shard: AsyncShard, apply_id: str) -> None:
        self._written.setdefault(shard, []).append(apply_id)

    def forget(self) -> None:
        """The batch rolled back: its receipts keep their full retention."""
        self._written = {}

    async def settle(self) -> None:
        """The batch committed: shorten its receipts (a failure here only costs memory until
        they expire, so it is not raised)."""
        written, self._written = self._written, {}
        for shard, apply_ids in written.items():
            for start in range(0, len(apply_ids), protocol.MAX_BATCH):
                chunk = apply_ids[start : start + protocol.MAX_BATCH]
                await shard.run(
                    Op.SETTLE, [self.settle_ms, *chunk], keys=(*shard.keys.all, _applied(shard))
                )

    async def offer(
        self, queue: AsyncDelayQueue, mode: DedupMode, items: Sequence[Claimed]
    ) -> list[int]:
        """Offer rows under their own ids; the offer script's status per row (1 created, 2
        replaced, 0 an existing task matched, 3 another task holds the id, 4 applied before).
        A shard that a finished reshard retired refuses (LAYOUT_RETIRED): the rows go again
        by the layout Redis records now, those written meanwhile refused by their receipts."""
        try:
            return await self._offer(queue, mode, items, again=False)
        except ServerError as exc:
            if not protocol.layout_retired(exc):
                raise
            return await self._offer(queue, mode, items, again=True)

    async def _offer(
        self, queue: AsyncDelayQueue, mode: DedupMode, items: Sequence[Claimed], *, again: bool
    ) -> list[int]:
        routes = await queue._routes(again=again)
        groups: dict[AsyncShard, list[int]] = {}
        for i, item in enumerate(items):
            spec = item.spec
            assert spec is not None
            key = protocol.spec_key(spec)
            limit_key = protocol.spec_limit_key(spec)  # a limit key's tasks share a shard
            if key is not None and limit_key is not None and len(routes.current) > 1:
                check_same_shard(key, limit_key, len(routes.current))  # as DelayQueue.offer
            route = protocol.spec_route(spec)
            shard = routes.home(route)
            if key is not None:
                shard = await queue._keyed_shard(routes, key, shard)
            if routes.previous:
                old = routes.previous_home(route)
                shard = await _previous_if_there(queue, old, item, shard)
            groups.setdefault(shard, []).append(i)
        await queue._register()
        statuses = [0] * len(items)
        for shard, positions in groups.items():
            chunks = [
                positions[start : start + protocol.OFFER_CHUNK]
                for start in range(0, len(positions), protocol.OFFER_CHUNK)
            ]
            arg_lists = [self._offer_args(mode, [items[p] for p in chunk]) for chunk in chunks]
            replies = await shard.write(
                Op.OFFER,
                arg_lists,
                [items[p].task_id for p in positions],
                keys=(*shard.keys.all, _applied(shard)),
                marked=True,  # a row applied before (a relay that died) writes nothing
            )
            for chunk, reply in zip(chunks, replies, strict=True):
                for position, (_, status) in zip(chunk, protocol.parse_offer(reply), strict=True):
                    statuses[position] = status
                    if status != CONFLICT:
                        self._note(shard, items[position].apply_id)
        return statuses

    def _offer_args(self, mode: DedupMode, items: Sequence[Claimed]) -> list[object]:
        specs: list[OfferSpec] = [item.spec for item in items if item.spec is not None]
        return [*protocol.offer_args(mode, specs), *(i.apply_id for i in items), self.keep_ms]

    async def cancel(self, queue: AsyncDelayQueue, item: Claimed) -> Outcome:
        """Cancel the row's task wherever the layout may hold it. Every shard looked at
        records the receipt, so a second application stops at the first one."""
        return await self._on_task(queue, item, Op.CANCEL, [item.task_id])

    async def reschedule(self, queue: AsyncDelayQueue, item: Claimed) -> Outcome:
        """Move the row's task wherever the layout may hold it (receipts as in :meth:`cancel`)."""
        return await self._on_task(
            queue, item, Op.RESCHEDULE, [item.task_id, item.due_kind, item.due_ms]
        )

    async def _on_task(
        self, queue: AsyncDelayQueue, item: Claimed, op: Op, args: list[Any]
    ) -> Outcome:
        receipt_ms = queue._shared.settings.receipt_ms
        for shard in (await queue._routes()).searched(item.task_id):
            receipt = shard.keys.receipt(op.value, protocol.new_nonce())
            (reply,) = await shard.write(
                op,
                [[receipt_ms, *args, item.apply_id, self.keep_ms]],
                [item.task_id],
                keys=(*shard.keys.all, receipt, _applied(shard)),
            )
            self._note(shard, item.apply_id)
            if int(reply[0]) == 2:
                return Outcome.DUPLICATE
            if int(reply[0]) == 1:
                return Outcome.APPLIED
        return Outcome.MISSING


def _applied(shard: AsyncShard) -> str:
    return shard.keys.key(APPLIED_ROLE)


async def _previous_if_there(
    queue: AsyncDelayQueue,
    old: AsyncShard,
    item: Claimed,
    shard: AsyncShard,
) -> AsyncShard:
    """During a reshard, ``old`` (the previous layout's shard for what routes the row: its
    limit key, dedup key or id) if it holds the row's task or its receipt (the row was
    applied there before the reshard began, and claimed again since): the row goes there,
    where it is found or refused, never created twice."""
    if old is shard:
        return shard
    runner = queue._runner
    held = await runner.command("HEXISTS", old.keys.key("tasks"), item.task_id)
    if not held:
        held = await runner.command("ZSCORE", _applied(old), item.apply_id) is not None
    return old if held else shard
