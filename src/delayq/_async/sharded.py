"""AsyncShardedQueue: one logical queue over N sub-queues, made by ``shards=N``.

Each sub-queue is an ordinary :class:`AsyncDelayQueue` under its own hash tag (so its own
cluster slot), all on one connection layer. Offers go to the shard of their dedup key, else
of their id; consumers take from every shard in turn and look only at the shards that may
have something due. The sync ``ShardedQueue`` in ``_sync/sharded.py`` is generated from this
file by ``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Self, cast

from .._core import protocol, sharding
from .._core.codecs import PayloadT
from .._core.durability import Durability
from .._core.keys import QueueKeys
from .._core.models import Backoff, DeadTask, Stats, TaskInfo, TaskState
from .._core.offers import (
    Offer,
    TaskId,
    build_offer,
    build_plain_offer,
    build_plain_offers,
    check_conflicts,
)
from .._core.protocol import OfferSpec
from .._core.scripts import Op
from .._core.timing import Duration, duration_ms
from ..exceptions import ConfigError, InvalidTaskError, RedisUnavailable, ServerError
from . import backend, runner
from .queue import AsyncDelayQueue, AsyncTask, _acked, _settled


class AsyncShardedQueue(AsyncDelayQueue[PayloadT]):
    """A queue made with ``shards=N``: the same methods as :class:`AsyncDelayQueue`.

    Tasks with a dedup key go to the key's shard (so dedup holds) with an id drawn to route
    there too; other tasks go to their id's shard. ``get``, ``cancel`` and ``reschedule`` by
    id ask the id's shard, and only if it does not hold the task (a task offered with both
    ``id=`` and ``key=``) the others. ``stats()`` sums the shards and lists them in
    ``Stats.shards``.
    """

    def __init__(
        self,
        name: str,
        redis: Any = None,
        *,
        shards: int,
        prefix: str = "dq",
        reconnect_timeout: Duration | None = None,
        durability: Durability | None = None,
        **options: Any,
    ) -> None:
        self._keys = QueueKeys(prefix, name)
        count = sharding.check_shards(shards)
        names = sharding.shard_names(name, count)
        try:
            reconnect_s = (
                None
                if reconnect_timeout is None
                else duration_ms(reconnect_timeout, "reconnect_timeout") / 1000
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self._owns_runner = not isinstance(redis, runner.Runner)
        self._runner = runner.connect(
            redis,
            f"delayq:{name}",
            reconnect_s,
            label=name,
            wait_s=durability.timeout if isinstance(durability, Durability) else 0.0,
        )
        self._bell = backend.Bell()
        self._overrides: dict[str, Any] = {}  # a view's policy settings (with_policy)
        self._part_options = {
            "prefix": prefix,
            "reconnect_timeout": reconnect_timeout,
            "durability": durability,
            **options,
        }
        # A bad option raises here, before anything connects (the client connects lazily).
        self._parts = [self._part(sub) for sub in names]
        # While a reshard is under way: the previous layout's sub-queues, drained by
        # consumers, no longer offered to (see _register and reshard()).
        self._old_parts: list[AsyncDelayQueue[PayloadT]] = []
        self._previous: int | None = None
        first = self._parts[0]
        self._codec = first._codec
        self._dedup = first._dedup
        self._safety_s = first._safety_s
        self._policy = first._policy
        self._durability_after_ack = isinstance(durability, Durability) and durability.after_ack
        self._turn = 0
        self._registered = False
        self._closed = False
        self._base: AsyncShardedQueue[PayloadT] | None = None  # set on a view (with_policy)
        self._views: weakref.WeakSet[AsyncDelayQueue[PayloadT]] = weakref.WeakSet()

    # -- the shards -------------------------------------------------------------------------

    def _part(self, sub: str) -> AsyncDelayQueue[PayloadT]:
        part: AsyncDelayQueue[PayloadT] = AsyncDelayQueue(sub, self._runner, **self._part_options)
        if self._overrides:  # a view's own settings, on a shard it opens itself
            part._policy = part._policy.overridden(sub, **self._overrides)
        part._ring(self._bell)
        part._registered = True  # the logical queue registers, not its shards
        return part

    @property
    def _every_part(self) -> list[AsyncDelayQueue[PayloadT]]:
        """The sub-queues that may hold tasks: the current layout's and a previous one's."""
        return self._parts + self._old_parts

    @property
    def shards(self) -> int:
        """How many sub-queues this queue spreads over."""
        return len(self._parts)

    @property
    def shard_queues(self) -> list[AsyncDelayQueue[PayloadT]]:
        """The sub-queues, in shard order (each an ordinary queue on its own hash tag)."""
        return list(self._parts)

    def with_policy(
        self,
        *,
        visibility_timeout: Duration | None = None,
        max_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
    ) -> Self:
        """A view of this queue with these lease and retry settings on every shard; see
        :meth:`AsyncDelayQueue.with_policy`."""
        settings: dict[str, Any] = {
            "visibility_timeout": visibility_timeout,
            "max_attempts": max_attempts,
            "retry_backoff": retry_backoff,
        }
        view = copy.copy(self)
        given = {name: value for name, value in settings.items() if value is not None}
        view._overrides = {**self._overrides, **given}
        view._parts = [part.with_policy(**settings) for part in self._parts]
        view._old_parts = [part.with_policy(**settings) for part in self._old_parts]
        view._policy = view._parts[0]._policy
        view._base = self._base or self
        view._owns_runner = False
        view._closed = False
        view._views = weakref.WeakSet()
        (self._base or self)._views.add(view)
        return view

    async def close(self) -> None:
        """Stop listening on every shard and release the connections."""
        if self._closed:
            return
        self._closed = True
        # A view's shards are views too (closing one hands back what it fetched ahead), but
        # for a previous layout's shards it opened itself.
        for view in list(self._views):
            await view.close()
        if self._base is not None:
            for part in self._every_part:
                await part.close()
            return
        for part in self._every_part:
            await part.close()
        if self._owns_runner:
            await self._runner.close()

    async def _register(self) -> None:
        """Record the shard count in Redis (the first opener's count holds) and refuse to
        work with another one: its tasks would be looked for on the wrong shards. While a
        reshard is under way, also open the previous layout's sub-queues."""
        if self._registered:
            return
        self._check_open()
        counts = sharding.shards_key(self._keys.prefix)
        await self._runner.command("HSETNX", counts, self.name, len(self._parts))
        layout = sharding.recorded_layout(await self._runner.command("HGET", counts, self.name))
        if layout is None or layout.shards != len(self._parts):
            recorded = layout.shards if layout is not None else None
            raise ConfigError(
                f"queue {self.name!r} has {recorded} shards in Redis, not {len(self._parts)}: "
                f"open it with shards={recorded} (or reshard it)"
            )
        if layout.previous is not None and self._previous is None:
            self._previous = layout.previous
            self._old_parts = [
                self._part(sub) for sub in layout.names(self.name)[len(self._parts) :]
            ]
        await self._runner.command("SADD", self._keys.registry, self.name)
        self._registered = True

    def _home(self, task_id: str) -> AsyncDelayQueue[PayloadT]:
        return self._parts[sharding.shard_of(protocol.check_id(task_id), len(self._parts))]

    def _searched(self, task_id: str) -> list[AsyncDelayQueue[PayloadT]]:
        """Where to look for a task by id: its shard first (where every id drawn here routes),
        then the previous layout's shard for it, then the rest."""
        first = [self._home(task_id)]
        if self._old_parts:
            first.append(self._old_parts[sharding.shard_of(task_id, len(self._old_parts))])
        return first + [part for part in self._every_part if not any(part is f for f in first)]

    async def _keyed_part(self, key: str, shard: int) -> AsyncDelayQueue[PayloadT]:
        """The sub-queue for an offer with ``key``: its shard, unless a reshard is under way
        and the previous layout's shard for the key holds it (so dedup still holds)."""
        if self._old_parts:
            old = self._old_parts[sharding.shard_of(key, len(self._old_parts))]
            if await self._runner.command("HEXISTS", old.keys.key("keys"), key):
                return old
        return self._parts[shard]

    def _route(self, offer: Offer) -> tuple[int, str]:
        """The shard of an offer and the id to give it if it has none."""
        count = len(self._parts)
        if offer.key is not None:
            shard = sharding.shard_of(offer.key, count)
            return shard, sharding.id_for_shard(shard, count, protocol.new_task_id)
        task_id = offer.id if offer.id is not None else protocol.new_task_id()
        return sharding.shard_of(task_id, count), task_id

    # -- producing --------------------------------------------------------------------------

    async def offer(
        self,
        payload: PayloadT,
        delay: Duration | None = None,
        *,
        at: datetime | float | None = None,
        key: str | None = None,
        id: str | None = None,
        priority: int = 0,
        headers: dict[str, str] | None = None,
        ttl: Duration | None = None,
        key_ttl: Duration | None = None,
        dedup: str | None = None,
    ) -> TaskId:
        """Schedule ``payload`` on its shard; see :meth:`AsyncDelayQueue.offer`."""
        mode = self._offer_mode(dedup)
        plain = key is None and id is None and at is None and ttl is None and key_ttl is None
        if plain and priority == 0 and not headers:  # the producer's hot path, on its shard
            task_id = protocol.new_task_id()
            spec = build_plain_offer(self._codec, payload, delay, task_id)
            await self._register()
            return await self._parts[sharding.shard_of(task_id, len(self._parts))]._offer_plain(
                spec
            )
        offer = Offer(payload, delay, at, key, id, priority, headers, ttl, key_ttl)
        shard, new_id = self._route(offer)
        spec = build_offer(self._codec, offer, new_id)
        await self._register()
        part = self._parts[shard] if key is None else await self._keyed_part(key, shard)
        return check_conflicts(await part._write_offers(mode, [spec], [id is None]))[0]

    async def offer_many(
        self, items: Iterable[Offer | tuple[Any, Duration | None]], *, dedup: str | None = None
    ) -> list[TaskId]:
        """Schedule many tasks, one batch per shard; see :meth:`AsyncDelayQueue.offer_many`."""
        items = list(items)
        mode = self._offer_mode(dedup)
        count = len(self._parts)
        if not items:
            return []
        await self._register()
        groups: dict[int, tuple[list[int], list[OfferSpec], list[bool]]] = {}
        if all(type(item) is tuple and len(item) == 2 for item in items):  # the common call
            ids = protocol.new_task_ids(len(items)) if items else []
            specs = build_plain_offers(self._codec, cast(list[tuple[Any, Any]], items), ids)
            for i, spec in enumerate(specs):
                group = groups.setdefault(sharding.shard_of(spec.id, count), ([], [], []))
                group[0].append(i)
                group[1].append(spec)
                group[2].append(True)
        else:
            for i, item in enumerate(items):  # everything encoded before anything is written
                if isinstance(item, tuple) and len(item) == 2:
                    offer = Offer(item[0], item[1])
                elif isinstance(item, Offer):
                    offer = item
                else:
                    raise InvalidTaskError(
                        f"offer_many items are (payload, delay) or Offer, not {item!r}"
                    )
                shard, new_id = self._route(offer)
                if offer.key is not None and self._old_parts:
                    part = await self._keyed_part(offer.key, shard)
                    shard = next(i for i, p in enumerate(self._every_part) if p is part)
                group = groups.setdefault(shard, ([], [], []))
                group[0].append(i)
                group[1].append(build_offer(self._codec, offer, new_id))
                group[2].append(offer.id is None)
        results: list[TaskId] = [TaskId("")] * len(items)
        for shard, (positions, specs, drawn) in sorted(groups.items()):
            written = await self._every_part[shard]._write_offers(mode, specs, drawn)
            for position, task_id in zip(positions, written, strict=True):
                results[position] = task_id
        return check_conflicts(results)

    async def cancel(self, task_id: str) -> bool:
        """Remove a task that is still waiting; see :meth:`AsyncDelayQueue.cancel`."""
        await self._register()
        for part in self._searched(task_id):
            if await part.cancel(task_id):
                return True
        return False

    async def reschedule(
        self, task_id: str, delay: Duration | None = None, *, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task's due time; see :meth:`AsyncDelayQueue.reschedule`."""
        await self._register()
        for part in self._searched(task_id):
            if await part.reschedule(task_id, delay, at=at):
                return True
        return False

    # -- reading ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of the task, or None; see :meth:`AsyncDelayQueue.get`."""
        await self._register()
        for part in self._searched(task_id):
            info = await part.get(task_id)
            if info is not None:
                return info
        return None

    async def stats(self) -> Stats:
        """The shards' counts summed (each shard read atomically, all in one round trip per
        Redis node); ``Stats.shards`` has each shard's own."""
        await self._register()
        every = self._every_part
        calls = [(Op.STATS, part.keys.all, [part._overdue_ms]) for part in every]
        replies = await self._runner.many(calls)
        parts = []
        for part, reply in zip(every, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            parts.append(protocol.stats_from_reply(part.name, reply))
        return sharding.merged_stats(self.name, parts)

    async def dead(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        """Dead-lettered tasks of every shard, oldest first."""
        if not isinstance(limit, int) or not isinstance(offset, int) or limit < 0 or offset < 0:
            raise ConfigError(f"limit and offset must be ints >= 0, got {limit!r}, {offset!r}")
        await self._register()
        rows: list[DeadTask] = []
        for part in self._every_part:
            rows += await part.dead(offset + limit, 0)
        rows.sort(key=lambda row: row.dead_at)
        return rows[offset : offset + limit]

    async def requeue_dead(self, task_id: str | None = None) -> int:
        """Put dead tasks back; see :meth:`AsyncDelayQueue.requeue_dead`."""
        await self._register()
        if task_id is not None:
            for part in self._searched(task_id):
                moved = await part.requeue_dead(task_id)
                if moved:
                    return moved
            return 0
        return sum([await part.requeue_dead() for part in self._every_part])

    async def tasks(
        self, state: TaskState | str, limit: int = 100, offset: int = 0
    ) -> list[TaskInfo]:
        """One page of the tasks in ``state`` over every shard, in the order they leave it."""
        await self._register()
        rows: list[TaskInfo] = []
        for part in self._every_part:
            rows += await part.tasks(state, offset + limit, 0)
        rows.sort(key=_leaving_order)
        return rows[offset : offset + limit]

    async def purge(self, states: Iterable[TaskState | str] | TaskState | str = ("dead",)) -> int:
        """Delete every task in ``states`` on every shard; see :meth:`AsyncDelayQueue.purge`."""
        wanted = [states] if isinstance(states, str) else list(states)
        await self._register()
        return sum([await part.purge(wanted) for part in self._every_part])

    # -- consuming --------------------------------------------------------------------------

    async def _poll(self, count: int, timeout: float | None) -> list[AsyncTask[PayloadT]]:
        """Up to ``count`` due tasks of one shard, the shards taken in turn; a shard whose last
        look found nothing due is not looked at again before its next due time, unless its
        channel announces an earlier one."""
        self._check_open()
        await self._register()
        every = self._every_part
        for part in every:  # tasks an ack fetched ahead first: they cost no round trip
            if part._ahead.tasks:
                ahead = await part._from_ahead(count)
                if ahead:
                    return ahead
        deadline = None if timeout is None else backend.monotonic() + timeout
        for part in every:
            await part._notifier.start()
        shards = len(every)
        while True:
            for step in range(shards):
                index = (self._turn + step) % shards
                part = every[index]
                until = part._quiet_until()
                if until is None or until <= backend.monotonic():
                    tasks = await part._poll(count, 0.0)
                    if tasks:
                        self._turn = (index + 1) % shards
                        return tasks
            now = backend.monotonic()
            if deadline is not None and now >= deadline:
                return []
            wakes = [part._quiet_until() for part in every]
            wake_at = min(now if w is None else w for w in wakes)
            until = wake_at if deadline is None else min(wake_at, deadline)
            marks = [part._notifier.mark() for part in every]
            slack = backend.TIMER_SLACK if until == wake_at else 0.0
            remaining = until - backend.monotonic() - slack
            if remaining > 0 and await self._bell.wait(self._news_since(marks), remaining):
                continue
            await backend.wait_out(until)

    def _news_since(self, marks: list[int]) -> Callable[[], bool]:
        """Whether any shard's channel announced something since ``marks``."""
        parts = self._every_part
        return lambda: any(p._notifier.mark() != m for p, m in zip(parts, marks, strict=True))

    async def ack(self, task: AsyncTask) -> None:
        """Mark a delivered task done; see :meth:`AsyncDelayQueue.ack`."""
        await self._part_of(task).ack(task)

    async def _ack_one(self, task: AsyncTask, *, fetch_ahead: bool) -> bool:
        return await self._part_of(task)._ack_one(task, fetch_ahead=fetch_ahead)

    async def _hand_back_ahead(self) -> None:
        for part in self._every_part:
            await part._hand_back_ahead()

    async def ack_many(self, tasks: Sequence[AsyncTask]) -> list[bool]:
        """Ack many tasks, in one round trip per Redis node whatever their shards; False where
        the lease was lost."""
        if self._durability_after_ack:  # each write waits for its replicas on its connection
            return await self._ack_per_shard(tasks)
        leased = [t for t in tasks if t.lease_token is not None]
        groups: dict[int, list[AsyncTask]] = {}
        for task in leased:
            groups.setdefault(id(self._part_of(task)), []).append(task)
        calls, batches = [], []
        for group in groups.values():
            for keys, args, batch in self._part_of(group[0])._ack_calls(group):
                calls.append((Op.ACK, keys, args))
                batches.append(batch)
        self._check_open()
        try:
            replies = await self._runner.many(calls)
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self.name!r}: {exc}") from exc
        acked: dict[int, bool] = {}
        for batch, reply in zip(batches, replies, strict=True):
            if isinstance(reply, ServerError):
                raise ServerError(f"queue {self.name!r}: {reply}")
            acked.update(zip(map(id, batch), _acked(reply), strict=True))
        return _settled(tasks, [acked[id(t)] for t in leased])

    async def _ack_per_shard(self, tasks: Sequence[AsyncTask]) -> list[bool]:
        results: list[bool] = [True] * len(tasks)
        groups: dict[int, list[int]] = {}
        for i, task in enumerate(tasks):
            groups.setdefault(id(self._part_of(task)), []).append(i)
        for positions in groups.values():
            part = self._part_of(tasks[positions[0]])
            acked = await part.ack_many([tasks[i] for i in positions])
            for i, ok in zip(positions, acked, strict=True):
                results[i] = ok
        return results

    async def nack(self, task: AsyncTask, delay: Duration | None = None) -> None:
        """Give a task back; see :meth:`AsyncDelayQueue.nack`."""
        await self._part_of(task).nack(task, delay)

    async def retry(
        self, task: AsyncTask, delay: Duration | None = None, *, error: str | None = None
    ) -> None:
        """Fail this attempt; see :meth:`AsyncDelayQueue.retry`."""
        await self._part_of(task).retry(task, delay, error=error)

    async def release(self, task: AsyncTask) -> None:
        """Hand back an unstarted task; see :meth:`AsyncDelayQueue.release`."""
        await self._part_of(task).release(task)

    async def reject(self, task: AsyncTask, error: str) -> None:
        """Dead-letter a task now; see :meth:`AsyncDelayQueue.reject`."""
        await self._part_of(task).reject(task, error)

    async def extend(self, task: AsyncTask, seconds: Duration) -> datetime:
        """Keep the lease longer; see :meth:`AsyncDelayQueue.extend`."""
        return await self._part_of(task).extend(task, seconds)

    def _part_of(self, task: AsyncTask) -> AsyncDelayQueue[PayloadT]:
        part = task.queue
        if part is None or not any(part is p for p in self._every_part):
            raise InvalidTaskError(f"task {task.id} was not delivered by queue {self.name!r}")
        return part


def _leaving_order(info: TaskInfo) -> tuple[float, int]:
    when = info.due_at or info.lease_expires_at or info.dead_at
    return (when.timestamp() if when is not None else 0.0, -info.priority)


AsyncDelayQueue._sharded_class = AsyncShardedQueue


async def reshard(name: str, redis: Any = None, *, shards: int, prefix: str = "dq") -> str:
    """Start moving queue ``name`` (sharded or not) to ``shards`` sub-queues, live.

    Nothing is copied: Redis records the new layout with the old one beside it. Queues opened
    with ``shards=<new count>`` offer to the new layout only (a dedup key still live in the
    old layout stays there) and consume from both, so the old sub-queues drain at their tasks'
    due times; queues opened with the old count refuse to open. Run consumers with the new
    count first, then producers; when the old layout is empty, :func:`finish_reshard`.
    Returns the recorded layout (``"<new>\\<<old>"``, 0 for an unsharded queue).
    """
    count = sharding.check_shards(shards)
    sharding.shard_names(name, count)  # validates the name for a sharded queue
    keys = QueueKeys(prefix, name)
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(await conn.command("HGET", field, name))
        if layout is not None and layout.previous is not None:
            raise ConfigError(
                f"queue {name!r} is already being resharded ({layout.previous} -> "
                f"{layout.shards} shards): finish that first"
            )
        old = layout.shards if layout is not None else 0
        if old == count:
            raise ConfigError(f"queue {name!r} already has {count} shards")
        new = sharding.Layout(count, old)
        await conn.command("HSET", field, name, new.encode())
        await conn.command("SADD", keys.registry, name)
        return new.encode()
    finally:
        await conn.close()


async def finish_reshard(name: str, redis: Any = None, *, prefix: str = "dq") -> str:
    """End a reshard of ``name`` once its previous layout holds no task; returns the layout.
    Raises :class:`ConfigError` while any task is left there (say how many)."""
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(await conn.command("HGET", field, name))
        if layout is None or layout.previous is None:
            raise ConfigError(f"queue {name!r} is not being resharded")
        old = layout.names(name)[layout.shards :]
        calls = [(Op.STATS, QueueKeys(prefix, sub).all, [1000]) for sub in old]
        left = 0
        for reply in await conn.many(calls):
            if isinstance(reply, Exception):
                raise reply
            left += protocol.stats_from_reply(name, reply).total
        if left:
            raise ConfigError(
                f"queue {name!r}: {left} task(s) still in the previous layout "
                f"({layout.previous} shards); they drain at their due times"
            )
        done = sharding.Layout(layout.shards)
        await conn.command("HSET", field, name, done.encode())
        return done.encode()
    finally:
        await conn.close()
