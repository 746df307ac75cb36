"""``q.limits``: the limits of a queue, kept in Redis so that every producer, worker and CLI
sees the same ones (issue #20). The sync ``Limits`` in ``_sync/limits.py`` is generated from
this file by ``scripts/unasync.py``.

On a sharded queue each key's tasks live on one shard (the key routes them, so its limit is
exact there); every shard holds the same limits. A whole-queue limit (``"*"``) would have to
be split across shards (a shard without work would waste its share, one with a backlog
would be held back) or read every shard's state in one script, which cluster slots forbid:
so a sharded queue refuses it; limit its keys instead.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

from .._core.limits import (
    DEFAULT_KEY,
    WHOLE_QUEUE,
    Limit,
    LimitInfo,
    check_limit_key,
    parse_limit_rows,
)
from .._core.scripts import Op
from ..exceptions import ConfigError

if TYPE_CHECKING:
    from .queue import AsyncDelayQueue
    from .shard import AsyncShard


class AsyncLimits:
    """The limits of one queue: ``q.limits.set("tenant:42", Limit(concurrency=2))``.

    Keys: a task's ``limit_key`` (given to ``offer``), ``"*"`` for the whole queue (every
    task, keyed or not, also counts against it) and :attr:`DEFAULT` (``"~default"``) for
    every key without a limit of its own.
    """

    WHOLE_QUEUE: Final = WHOLE_QUEUE
    DEFAULT: Final = DEFAULT_KEY

    def __init__(self, queue: AsyncDelayQueue[Any]) -> None:
        self._queue = queue

    async def _shards(self) -> list[AsyncShard]:
        return await self._queue._all()

    async def _homes(self, key: str) -> list[AsyncShard]:
        """The shards holding the key's tasks: one per layout (a reshard's previous one too,
        until it is drained), each key's tasks sharing one shard of each."""
        routes = await self._queue._routes()
        whole = key in (WHOLE_QUEUE, DEFAULT_KEY)  # kept alike on every shard: the first's
        homes = [routes.current[0] if whole else routes.home(key)]
        if routes.previous:
            old = routes.previous[0] if whole else routes.previous_home(key)
            homes += [old] if old not in homes else []
        return homes

    async def set(self, key: str, limit: Limit) -> None:
        """Give ``key`` this limit (replacing its own, if any). Tasks waiting under the old
        limits are judged again at once under the new ones."""
        check_limit_key(key)
        if not isinstance(limit, Limit):
            raise ConfigError(f"limit must be a delayq.Limit, not {limit!r}")
        shards = await self._shards()
        if key == WHOLE_QUEUE and len(shards) > 1:
            raise ConfigError(
                "a whole-queue limit ('*') on a sharded queue would be split across shards "
                "and inexact: limit its keys instead (each key's tasks share one shard)"
            )
        for shard in shards:
            await shard.run(Op.LIMIT_ADMIN, ["set", key, limit.encode()])

    async def get(self, key: str) -> LimitInfo:
        """The key's limit (None if it has none of its own), running and waiting counts and
        next admission time."""
        check_limit_key(key)
        rows = [
            parse_limit_rows(await shard.run(Op.LIMIT_ADMIN, ["get", key]))[0]
            for shard in await self._homes(key)
        ]
        return functools.reduce(_merged, rows[1:], rows[0])

    async def list(self) -> list[LimitInfo]:
        """Every key with a limit, leases running or tasks waiting; limits first (sorted),
        then the other keys. On a sharded queue, the shards' counts are summed."""
        merged: dict[str, LimitInfo] = {}
        for shard in await self._shards():
            for row in parse_limit_rows(await shard.run(Op.LIMIT_ADMIN, ["list"])):
                merged[row.key] = _merged(merged.get(row.key), row)
        return list(merged.values())

    async def remove(self, key: str) -> bool:
        """Drop the key's own limit (it falls back to the default, if any); True if it had
        one. Its waiting tasks are judged again at once."""
        check_limit_key(key)
        removed = False
        for shard in await self._shards():
            reply = await shard.run(Op.LIMIT_ADMIN, ["remove", key])
            removed = removed or int(reply[0]) == 1
        return removed


def _merged(seen: LimitInfo | None, row: LimitInfo) -> LimitInfo:
    if seen is None:
        return row
    times = [t for t in (seen.next_admission_at, row.next_admission_at) if t is not None]
    return LimitInfo(
        row.key,
        seen.limit or row.limit,
        seen.running + row.running,
        seen.waiting + row.waiting,
        min(times) if times else None,
        seen.limit_of or row.limit_of,
    )
