"""AsyncDelayQueue: the asyncio front end, the one face of a queue on every layout.

A queue's tasks live in one shard (an unsharded queue), in N (a sharded one) or in both
layouts' while it is resharded: Redis records which (``sharding.Layout``), and the queue reads
it on first use and follows it when it changes, routing each call to its shards
(``shard.py``) with the pure sharding code.

The sync ``DelayQueue`` in ``_sync/queue.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, Literal, Self, Unpack, cast

from .._core import limits, protocol, sharding, tracing
from .._core.codecs import PayloadT
from .._core.connection import Topology
from .._core.durability import Durability
from .._core.history import (
    DEFAULT_MAX_DETAIL_BYTES,
    DEFAULT_MAX_EVENTS,
    DEFAULT_RETENTION,
    HistoryEvent,
    HistorySettings,
)
from .._core.history import set_args as history_set_args
from .._core.keys import QueueKeys
from .._core.limits import PauseInfo, PauseUntil, check_same_shard
from .._core.models import (
    HELD_STATES,
    Backoff,
    DeadTask,
    DedupMode,
    QueuePolicy,
    Stats,
    TaskInfo,
    TaskState,
    to_datetime,
)
from .._core.offers import (
    Offer,
    OfferOptions,
    TaskId,
    build_offer,
    build_plain_offer,
    build_plain_offers,
    check_conflicts,
    is_plain,
    offer_of,
)
from .._core.options import QueueOptions, check_int, dedup_mode, overridden_policy
from .._core.protocol import FetchResult, OfferSpec
from .._core.schedule import SCHEDULE_HEADER, fire_time_of
from .._core.scripts import Op
from .._core.text import printable
from .._core.timing import Duration, due_spec, duration_ms
from .._core.wakeups import plan_wait
from ..exceptions import (
    ConfigError,
    DecodeError,
    InvalidTaskError,
    LeaseLost,
    QueueClosed,
    RedisUnavailable,
    ServerError,
)
from . import backend, runner
from .consumer import AsyncConsumer
from .limits import AsyncLimits
from .schedules import AsyncSchedules
from .shard import AckPosted, AsyncShard, ShardSettings, Watch

log = logging.getLogger("delayq")


@dataclass(frozen=True, slots=True, eq=False)
class AsyncTask(Generic[PayloadT]):
    """A task handed to this consumer, with the lease that makes it ours until acked."""

    id: str
    payload: PayloadT  # an instance of the queue's payload_type, if it has one
    attempts: int  # deliveries so far, this one included
    due_ms: int  # epoch ms, server clock
    delivered_ms: int  # epoch ms, server clock
    priority: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    lease_token: str | None = None  # None in at-most-once mode
    queue: AsyncDelayQueue[PayloadT] | None = field(default=None, repr=False)
    # Set once an ack, nack, retry, release or reject of this delivery went through (consume()
    # then leaves it alone).
    _settled: bool = field(default=False, init=False, repr=False, compare=False)
    # The shard that leased it: its settling calls go there, whatever the layout is by then.
    _shard: AsyncShard | None = field(default=None, repr=False, compare=False)
    # At most once: what its offer gave beyond the envelope (protocol.RawTask.kept).
    _kept: str = field(default="", repr=False, compare=False)

    @property
    def due_at(self) -> datetime:
        """When the task was due (UTC, Redis's clock)."""
        return to_datetime(self.due_ms)  # type: ignore[return-value]

    @property
    def delivered_at(self) -> datetime:
        """When Redis handed the task out (UTC, Redis's clock)."""
        return to_datetime(self.delivered_ms)  # type: ignore[return-value]

    @property
    def lateness_ms(self) -> int:
        """How long after its due time the task was handed out."""
        return self.delivered_ms - self.due_ms

    @property
    def schedule(self) -> str | None:
        """The name of the recurring schedule that fired this task (None for other tasks)."""
        return self.headers.get(SCHEDULE_HEADER)

    @property
    def fire_time(self) -> datetime | None:
        """A schedule's fire: its nominal time (UTC, before jitter); None for other tasks."""
        return fire_time_of(self.headers)

    def _queue(self) -> AsyncDelayQueue[PayloadT]:
        if self.queue is None:
            raise QueueClosed("task is detached from its queue")
        return self.queue

    async def ack(self) -> None:
        """Mark the task done; see :meth:`AsyncDelayQueue.ack`."""
        await self._queue().ack(self)

    async def nack(self, delay: Duration | None = None) -> None:
        """Give the task back; see :meth:`AsyncDelayQueue.nack`."""
        await self._queue().nack(self, delay)

    async def retry(self, delay: Duration | None = None, *, error: str | None = None) -> None:
        """Fail this attempt; deliver again after ``delay`` or the queue's backoff."""
        await self._queue().retry(self, delay, error=error)

    async def release(self) -> None:
        """Hand the task back unstarted; see :meth:`AsyncDelayQueue.release`."""
        await self._queue().release(self)

    async def reject(self, error: str) -> None:
        """Dead-letter the task now; see :meth:`AsyncDelayQueue.reject`."""
        await self._queue().reject(self, error)

    async def throttle(self, retry_after: Duration) -> None:
        """Hold the task's limit key; see :meth:`AsyncDelayQueue.throttle`."""
        await self._queue().throttle(self, retry_after)

    async def extend(self, seconds: Duration) -> datetime:
        """Extend the lease; see :meth:`AsyncDelayQueue.extend`."""
        return await self._queue().extend(self, seconds)


def _settled(tasks: Sequence[AsyncTask], acked: list[bool]) -> list[bool]:
    """Per task, whether its ack went through (``acked`` holds the leased ones', in order; a
    task taken at-most-once has nothing to ack), marking those that did as settled."""
    status = iter(acked)
    results = [next(status) if t.lease_token is not None else True for t in tasks]
    for task, ok in zip(tasks, results, strict=True):
        if ok:
            object.__setattr__(task, "_settled", True)
    return results


def _news_since(shards: Sequence[AsyncShard]) -> Callable[[], bool]:
    """Whether any of ``shards``' channels announced something since now."""
    marks = [shard.notifier.mark() for shard in shards]
    return lambda: any(s.notifier.mark() != m for s, m in zip(shards, marks, strict=True))


def _leaving_order(info: TaskInfo) -> tuple[float, int]:
    when = info.due_at or info.lease_expires_at or info.dead_at
    return (when.timestamp() if when is not None else 0.0, -info.priority)


@dataclass(eq=False)
class _Routes:
    """The shards of the layout Redis recorded for a queue, as last read (monotonic)."""

    layout: sharding.Layout | None  # None: unsharded, one shard under the queue's own name
    current: list[AsyncShard]
    previous: list[AsyncShard]  # a reshard's previous layout: drained, not offered to
    read_at: float

    @functools.cached_property
    def every(self) -> list[AsyncShard]:
        """Each shard once: close counts share a sub-queue (4 and 5 shards: ``~0.3``)."""
        return self.current + [shard for shard in self.previous if shard not in self.current]

    def home(self, route: str) -> AsyncShard:
        """The shard of a routing value (a dedup key or a task id) in the current layout."""
        if len(self.current) == 1:  # unsharded: no hash on the producer's hot path
            return self.current[0]
        return self.current[sharding.shard_of(route, len(self.current))]

    def previous_home(self, route: str) -> AsyncShard:
        """The shard of a routing value in a reshard's previous layout (which must exist)."""
        return self.previous[sharding.shard_of(route, len(self.previous))]

    def searched(self, task_id: str) -> list[AsyncShard]:
        """Where to look for a task by id: its shard first (where every id drawn here routes),
        then the previous layout's shard for it, then the rest."""
        first = [self.home(task_id)]
        if self.previous:
            first.append(self.previous_home(task_id))
        return first + [shard for shard in self.every if shard not in first]


def _drop_channels(shared: _Shared) -> None:
    for shard in list(shared.engines.values()):
        shard.notifier.drop()


@dataclass(eq=False)
class _Shared:
    """What a queue and its ``with_policy`` views share: connections, shards, the layout."""

    runner: runner.Runner
    owns_runner: bool
    settings: ShardSettings
    sharded_channel: bool
    bell: backend.Bell = field(default_factory=backend.Bell)
    engines: dict[str, AsyncShard] = field(default_factory=dict)
    routes: _Routes | None = None
    known: bool | None = None  # Redis has seen the queue (registry); None: not asked yet
    warned_unknown: bool = False
    registered: bool = False


class AsyncDelayQueue(Generic[PayloadT]):
    """A delayed queue on Redis: tasks are delivered at their due time to one consumer each.

    The same class serves every layout: one slot, N shards (``shards=N`` creates one), or both
    during a reshard (:func:`reshard`); tasks point at it whatever shard they came from.

    Args:
        name: queue name (the Redis hash tag of all its keys).
        redis: a URL (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``,
            ``redis+cluster://``), a ``redis.asyncio`` ``Redis`` (a Sentinel ``master_for``
            client too) or ``RedisCluster`` client (not ``decode_responses``), a connection
            handle (:func:`delayq.aconnect`: the queue shares its pools, pub/sub connections
            and ``reconnect_timeout``), or None for ``$REDIS_URL``
            (``redis://127.0.0.1:6379/0`` when it is not set).
        codec: ``"json"`` (default), ``"msgpack"`` or ``"pickle"`` (explicit opt-in).
        payload_type: the payloads' class (dataclass, TypedDict, NamedTuple, msgspec Struct or,
            with pydantic installed, pydantic model): payloads round-trip as that class, and
            type checkers see ``task.payload`` as it. A class that cannot round-trip is a
            :class:`ConfigError` here.
        visibility_timeout: seconds a delivered task stays leased before it is delivered again.
        max_attempts: deliveries before a failing task is dead-lettered.
        retry_backoff: delay policy for retries and expired leases.
        ack: True for at-least-once with leases; False for at-most-once (take removes).
        dedup: default behaviour of ``offer(key=...)``: ``"keep"`` or ``"replace"``.
        safety_interval: longest sleep between looks at Redis when no message arrives. Every
            change that makes a task due earlier is announced on the queue's channel, and a
            reconnect of the listener triggers a look, so this only bounds the cost of a lost
            message; an idle consumer makes one script call per interval. On a queue of N
            shards that is one look per interval in all, each shard's every N intervals: a
            message lost there costs up to N intervals.
        reconnect_timeout: how long a call keeps retrying a lost connection or a failover
            before it raises :class:`RedisUnavailable` (``take`` retries for ever). None: 10 s
            on a single server, 40 s through Sentinel, 25 s on a cluster (a failover with the
            servers' default settings).
        max_payload_bytes: limit on an encoded task.
        overdue_after: a due task waiting longer than this counts as overdue in stats.
        prefix: first part of every key name.
        durability: a :class:`Durability`: after each offer (and ack, if it says so) wait
            until that many replicas (or append-only files) confirm the write, on the
            connection that made it; None (default) answers as soon as the master has it.
        fetch_ahead: in a ``take()``/``poll()`` then ``ack()`` loop, how many due tasks an
            ack may fetch ahead in its own round trip (at most what the loop hands out in
            50 ms, so a slow loop fetches one and leaves the rest to other consumers); 0:
            none, two round trips per task. ``close()`` hands them back at once.
        shards: only to create a sharded queue: spread it over this many sub-queues, each
            under its own hash tag (so on its own cluster slot, spread over the masters). A
            queue otherwise follows the layout Redis recorded for it (one slot, N shards, or
            both while it is resharded), consumers and producers alike; a count that disagrees
            with Redis is a :class:`ConfigError` at first use.
        create: the queue is meant to be new: register it at first use, so that a consumer
            opened before any producer does not warn that Redis has never seen it.
        history: keep each task's history (docs/history.md) for this long after it ends
            (seconds or a timedelta; True: a day; or :class:`HistorySettings`), written to
            Redis at first use, so every producer, worker and CLI of the queue records it;
            False turns it off; None (default) leaves it as Redis has it.
    """

    def __init__(
        self,
        name: str,
        redis: Any = None,
        *,
        codec: str = "json",
        payload_type: type[PayloadT] | None = None,
        visibility_timeout: Duration = 30.0,
        max_attempts: int = 10,
        retry_backoff: Backoff | None = None,
        ack: bool = True,
        dedup: str = "keep",
        safety_interval: Duration = 10.0,
        reconnect_timeout: Duration | None = None,
        max_payload_bytes: int = 1 << 20,
        overdue_after: Duration = 1.0,
        prefix: str = "dq",
        durability: Durability | None = None,
        fetch_ahead: int = 8,
        shards: int | None = None,
        create: bool = False,
        history: Duration | bool | HistorySettings | None = None,
    ) -> None:
        options = QueueOptions.of(
            codec=codec, payload_type=payload_type, visibility_timeout=visibility_timeout,
            max_attempts=max_attempts, retry_backoff=retry_backoff, ack=ack, dedup=dedup,
            safety_interval=safety_interval, reconnect_timeout=reconnect_timeout,
            max_payload_bytes=max_payload_bytes, overdue_after=overdue_after, prefix=prefix,
            durability=durability, fetch_ahead=fetch_ahead, shards=shards, create=create,
            history=history,
        )  # fmt: skip
        self._keys = options.keys(name)
        self._shards = options.shards
        self._create = options.create
        self._history = options.history
        self._fetch_ahead = options.fetch_ahead
        self._dedup = options.dedup
        self._safety_s = options.safety_s
        self._overdue_ms = options.overdue_ms
        self._codec = options.codec
        self._policy = options.policy
        self._durability = durability = options.durability
        conn = runner.connect(
            redis,
            f"delayq:{name}",
            options.reconnect_s,
            label=name,
            wait_s=durability.timeout_s if durability else 0.0,
        )
        # How long a call's receipt lives, so that a resend is answered from it: longer than
        # any retry of ours (reconnect_timeout) plus redis-py's own.
        receipt_ms = int(conn.reconnect_s * 1000) + 5000
        self._shared = _Shared(
            runner=conn,
            owns_runner=not runner.shared(redis),  # a runner or a handle is its maker's
            settings=ShardSettings(name, self._codec, durability, receipt_ms),
            # On a cluster, wake-ups go out on the slot's node only (a shard channel).
            sharded_channel=conn.topology is Topology.CLUSTER,
        )
        self._runner = conn
        if self._shared.sharded_channel:
            self._keys = options.keys(name, sharded_channel=True)
        self._watches: dict[str, Watch] = {}
        self._turn = 0  # the shard a consumer looks at first, taken in turn
        self._closed = False
        self._base: AsyncDelayQueue[PayloadT] | None = None  # set on a view (with_policy)
        self._views: weakref.WeakSet[AsyncDelayQueue[PayloadT]] = weakref.WeakSet()
        if isinstance(redis, runner.Handle):
            redis._adopt(self)
        # Collected without close(): its shards' channels leave the pub/sub connections,
        # which a handle (or a client passed in) keeps for other queues.
        weakref.finalize(self, _drop_channels, self._shared).atexit = False

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._keys.name

    @property
    def keys(self) -> QueueKeys:
        """The key names of the queue unsharded (a sharded queue's shards have their own)."""
        return self._keys

    @property
    def schedules(self) -> AsyncSchedules:
        """The queue's recurring schedules (docs/schedules.md): ``upsert``, ``get``, ``list``,
        ``pause``, ``resume``, ``remove``, ``trigger``, ``backfill``."""
        return AsyncSchedules(self)

    @property
    def shards(self) -> int | None:
        """How many shards new tasks go to, as Redis recorded it when this queue last looked
        (1 for an unsharded queue); None before its first call."""
        routes = self._shared.routes
        return None if routes is None else len(routes.current)

    @property
    def known(self) -> bool | None:
        """Whether Redis has seen this queue (a producer offered to it, or it was created);
        None before its first call. A consumer of an unknown queue warns and waits."""
        return self._shared.known

    @property
    def policy(self) -> QueuePolicy:
        """The lease and retry settings this queue object hands tasks out with (read-only)."""
        lease_ms = self._policy.lease_ms
        return QueuePolicy(
            visibility_timeout=lease_ms / 1000 if lease_ms else None,
            max_attempts=self._policy.max_attempts,
            retry_backoff=self._policy.backoff,
            safety_interval=self._safety_s,
        )

    def with_policy(
        self,
        *,
        visibility_timeout: Duration | None = None,
        max_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
    ) -> Self:
        """A view of this queue that hands tasks out with these lease and retry settings (the
        others kept); this queue is left as it was. The view shares its connections: closing
        it closes only the view, closing this queue closes both."""
        policy = overridden_policy(
            self._policy, self.name, visibility_timeout, max_attempts, retry_backoff
        )
        view = copy.copy(self)
        view._policy = policy
        view._base = self._base or self
        view._watches = {}
        view._turn = 0
        view._closed = False
        view._views = weakref.WeakSet()
        (self._base or self)._views.add(view)
        return view

    async def close(self) -> None:
        """Stop listening and release connections (the client too, if the queue made it)."""
        if self._closed:
            return
        for view in list(self._views):  # they share the connections closed here
            await view.close()
        await self._hand_back_ahead()
        self._closed = True
        if self._base is not None:
            return  # a view: the connections are its base queue's
        shared = self._shared
        for shard in list(shared.engines.values()):
            await shard.close()
        if shared.owns_runner:
            await shared.runner.close()

    async def __aenter__(self) -> AsyncDelayQueue[PayloadT]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def ping(self) -> float:
        """Check that Redis answers, retrying a lost connection up to the reconnect timeout;
        the seconds the answer took. Raises :class:`RedisUnavailable` (at once for a host
        name that does not resolve or a TLS handshake refused)."""
        self._check_open()
        started = backend.monotonic()
        await self._runner.command("PING")
        return backend.monotonic() - started

    # -- the layout -------------------------------------------------------------------------

    async def _routes(self, *, again: bool = False) -> _Routes:
        """The shards to use: the layout as last read, read again once it is a safety interval
        old (so a queue opened before a reshard follows it) or if ``again``."""
        self._check_open()
        routes = self._shared.routes
        if routes is None:
            return await self._read_layout()
        if again or backend.monotonic() - routes.read_at >= self._safety_s:
            try:
                return await self._read_layout()
            except RedisUnavailable as exc:  # the layout known is still the best guess
                log.debug("delayq: could not read the layout of %s: %s", self.name, exc)
                routes.read_at = backend.monotonic()
        return routes

    async def _read_layout(self) -> _Routes:
        self._check_open()
        shared, conn = self._shared, self._runner
        counts = sharding.shards_key(self._keys.prefix)
        layout = sharding.recorded_layout(await conn.command("HGET", counts, self.name), self.name)
        if shared.routes is None:
            layout = await self._first_look(layout)
        elif not shared.known:
            shared.known = bool(await conn.command("SISMEMBER", self._keys.registry, self.name))
        current, previous = sharding.layout_names(self.name, layout)
        routes = _Routes(
            layout,
            [self._engine(name) for name in current],
            [self._engine(name) for name in previous],
            backend.monotonic(),
        )
        if shared.routes is None and self._history is not None:  # [H] as create=True registers
            await self._apply_history(routes.every, self._history)
        old = shared.routes
        shared.routes = routes
        if old is not None and old.layout != layout:
            log.info(
                "delayq: queue %s now has layout %s (was %s)",
                self.name, sharding.describe(layout), sharding.describe(old.layout),
            )  # fmt: skip
        return routes

    async def _first_look(self, layout: sharding.Layout | None) -> sharding.Layout | None:
        """Check the layout asked for (``shards=``) against Redis's, creating it for a new
        queue; learn whether Redis has seen the queue."""
        conn, shared, wanted = self._runner, self._shared, self._shards
        registry = self._keys.registry
        shared.known = bool(await conn.command("SISMEMBER", registry, self.name))
        if layout is None and wanted is not None and wanted > 1:
            if shared.known:
                raise ConfigError(
                    f"queue {self.name!r} is unsharded in Redis: open it without shards=, or "
                    f"move it to {wanted} shards with `delayq reshard {self.name} --shards "
                    f"{wanted}`"
                )
            counts = sharding.shards_key(self._keys.prefix)
            await conn.command("HSETNX", counts, self.name, wanted)
            layout = sharding.recorded_layout(
                await conn.command("HGET", counts, self.name), self.name
            )
            await self._announce_layout([self.name])
        recorded = layout.shards if layout is not None else 1
        if wanted is not None and wanted != recorded:
            raise ConfigError(
                f"queue {self.name!r} has {recorded} shard(s) in Redis, not {wanted}: open it "
                f"without shards= (a queue follows the layout Redis recorded), or reshard it"
            )
        if self._create and not shared.known:
            await self._register()
        return layout

    async def _announce_layout(self, names: Sequence[str]) -> None:
        """Tell consumers waiting on these (sub-)queues to look at the layout again now rather
        than at their next safety interval (a hint: a lost one costs only that wait)."""
        for name in names:
            keys = QueueKeys(self._keys.prefix, name, sharded_channel=self._shared.sharded_channel)
            await announce_layout(self._runner, keys)

    def _engine(self, name: str) -> AsyncShard:
        shared = self._shared
        shard = shared.engines.get(name)
        if shard is None:
            self._check_open()  # closed while its layout was read: no shard to subscribe after
            keys = QueueKeys(self._keys.prefix, name, sharded_channel=shared.sharded_channel)
            shard = shared.engines[name] = AsyncShard(
                shared.runner, keys, shared.settings, shared.bell
            )
        return shard

    def _watch(self, shard: AsyncShard) -> Watch:
        watch = self._watches.get(shard.name)
        if watch is None or watch.shard is not shard:
            watch = self._watches[shard.name] = Watch(shard)
        return watch

    async def _register(self) -> None:
        """Before the first write: record the queue's name in the registry (and check that
        the server can keep the durability asked for)."""
        shared = self._shared
        if shared.registered:
            return
        self._check_open()
        if self._durability is not None and self._durability.aof:
            try:  # before anything is written: a server without it refuses the probe
                await self._runner.command("WAITAOF", 1, 0, 1)
            except ServerError as exc:
                raise ConfigError(
                    "Durability(aof=True) needs WAITAOF (Redis 7.2+ or Valkey 8) and "
                    f"appendonly yes; {self._runner.where} refused it: {exc}"
                ) from exc
        await self._runner.command("SADD", self._keys.registry, self.name)
        shared.registered = shared.known = True

    async def _warn_if_unknown(self) -> None:
        """A consumer of a queue Redis has never seen says so once, with the names it may
        have meant, instead of waiting in silence."""
        shared = self._shared
        if shared.known or shared.warned_unknown:
            return
        shared.warned_unknown = True
        raw = await self._runner.command("SMEMBERS", self._keys.registry)
        names = sorted(n.decode(errors="replace") if isinstance(n, bytes) else n for n in raw)
        close = difflib.get_close_matches(self.name, names, n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        log.warning(
            "delayq: queue %r is unknown to Redis (nothing was ever offered to it under "
            "prefix %r): waiting for it.%s A new queue: create=True registers it (delayq "
            "worker --create; in Django, \"create\": True in its OPTIONS).",
            self.name, self._keys.prefix, hint,
        )  # fmt: skip

    # -- producing --------------------------------------------------------------------------

    async def offer(
        self, payload: PayloadT, delay: Duration | None = None, **options: Unpack[OfferOptions]
    ) -> TaskId:
        """Schedule ``payload`` after ``delay`` seconds (or at ``at``); return the task id.

        ``options`` (keyword-only, :class:`OfferOptions`): ``at``, ``key``, ``id``,
        ``priority``, ``headers``, ``ttl``, ``key_ttl``, ``dedup``. The id is a
        :class:`TaskId`, a ``str`` whose ``outcome`` says what happened: ``created``, or, with
        ``key``, ``existing`` (another live task holds the key and is kept; its id is
        returned, ``dedup="keep"``) or ``replaced`` (the pending task holding the key got this
        payload and due time, ``dedup="replace"``). ``key_ttl`` keeps the key taken for that
        long after the task completes. With ``id``, an offer repeated after a timeout is a
        no-op (``existing``); if a task with other content (payload, headers, priority, key)
        holds the id, it is kept and :class:`TaskIdConflict` is raised. ``ttl`` drops the task
        if it is not delivered within that long after its due time. Nothing is written if any
        argument is invalid.
        """
        if tracing.active():  # inside a span: a PRODUCER span, whose context the task keeps
            with tracing.producer_span(self.name, 1):
                return await self._offer(payload, delay, options)
        return await self._offer(payload, delay, options)

    async def _offer(self, payload: PayloadT, delay: Duration | None, options: Any) -> TaskId:
        if options:
            offer = offer_of(payload, delay, options, f"{type(self).__name__}.offer")
            mode = self._offer_mode(options.get("dedup"))
            if not is_plain(offer):
                return await self._offer_one(mode, offer)
        spec = build_plain_offer(self._codec, payload, delay)  # the common case, made short
        routes = await self._routes()
        await self._register()
        try:
            return await routes.home(spec.id).offer_plain(spec)
        except ServerError as exc:
            if not protocol.layout_retired(exc):
                raise
            return (await self._rewrite_retired(DedupMode.KEEP, [spec], [True]))[0]

    async def _offer_one(self, mode: DedupMode, offer: Offer) -> TaskId:
        """Offer one task with options (a key, an id, a due time, ...)."""
        routes = await self._routes()
        shard, new_id = self._route(routes, offer)
        spec = build_offer(self._codec, offer, new_id)
        await self._register()
        if offer.key is not None:
            shard = await self._keyed_shard(routes, offer.key, shard)
        elif offer.id is not None and routes.previous:
            shard = await self._id_shard(routes, spec.id, shard, offer.limit_key)
        return check_conflicts(await self._write_to(shard, mode, [spec], [offer.id is None]))[0]

    def _route(
        self, routes: _Routes, offer: Offer, drawn: str | None = None
    ) -> tuple[AsyncShard, str]:
        """The shard of an offer and the id to give it if it has none (``drawn``, if it
        fits): a task with a dedup key goes to the key's shard (so dedup holds) with an id
        that routes there too (so it is found by its id alone); another task goes to its id's
        shard."""
        count = len(routes.current)
        routed_by = offer.key if offer.limit_key is None else offer.limit_key  # [L]
        if offer.key is not None and offer.limit_key is not None and count > 1:
            check_same_shard(offer.key, offer.limit_key, count)
        if routed_by is not None:
            shard = sharding.shard_of(protocol.check_key(routed_by), count)
            if drawn is None or sharding.shard_of(drawn, count) != shard:
                drawn = sharding.id_for_shard(shard, count, protocol.new_task_id)
            return routes.current[shard], drawn
        if offer.id is not None:
            task_id = protocol.check_id(offer.id)
        else:
            task_id = drawn or protocol.new_task_id()
        return routes.home(task_id), task_id

    async def _keyed_shard(self, routes: _Routes, key: str, shard: AsyncShard) -> AsyncShard:
        """The shard for an offer with ``key``: its own, unless a reshard is under way and the
        previous layout's shard for the key holds it (so dedup still holds)."""
        if routes.previous:
            old = routes.previous_home(key)
            if await old.holds_key(key):
                return old
        return shard

    async def _id_shard(
        self, routes: _Routes, task_id: str, shard: AsyncShard, limit_key: str | None
    ) -> AsyncShard:
        """The shard for an offer with the caller's own id: its own, unless a reshard is under
        way and the previous layout's shard for the id (for its limit key, which placed it,
        if it has one) holds a task with it (the offer then matches that task instead of
        creating a second one)."""
        old = routes.previous_home(limit_key or task_id)
        if old is not shard and await old.holds_task(task_id):
            return old
        return shard

    async def offer_many(
        self, items: Iterable[Offer | tuple[Any, Duration | None]], *, dedup: str | None = None
    ) -> list[TaskId]:
        """Schedule many tasks in few round trips (one batch per shard); ``items`` are
        ``(payload, delay)`` pairs or :class:`Offer` objects. Every item is validated and
        encoded before anything is written. Returns the ids in order, each a :class:`TaskId`
        saying what happened as in :meth:`offer`. If some items' own ids are held by tasks
        with other content, every other item is still written, then :class:`TaskIdConflict`
        is raised with all the results."""
        items = list(items)
        if tracing.active() and items:
            with tracing.producer_span(self.name, len(items)):
                return await self._offer_many(items, dedup)
        return await self._offer_many(items, dedup)

    async def _offer_many(self, items: list[Any], dedup: str | None) -> list[TaskId]:
        mode = self._offer_mode(dedup)
        if not items:
            return []
        routes = await self._routes()
        groups: dict[AsyncShard, tuple[list[int], list[OfferSpec], list[bool]]] = {}
        if all(type(item) is tuple and len(item) == 2 for item in items):  # the common call
            ids = protocol.new_task_ids(len(items))
            specs = build_plain_offers(self._codec, cast(list[tuple[Any, Any]], items), ids)
            if len(routes.current) == 1:
                groups[routes.current[0]] = (list(range(len(specs))), specs, [True] * len(specs))
            else:
                for i, spec in enumerate(specs):
                    group = groups.setdefault(routes.home(spec.id), ([], [], []))
                    group[0].append(i)
                    group[1].append(spec)
                    group[2].append(True)
        else:
            keyed: list[tuple[int, str]] = []
            own_ids: dict[int, str] = {}  # the caller's ids, during a reshard
            ids = protocol.new_task_ids(len(items))
            for i, item in enumerate(items):  # everything encoded before anything is written
                if isinstance(item, tuple) and len(item) == 2:
                    offer = Offer(item[0], item[1])
                elif isinstance(item, Offer):
                    offer = item
                else:
                    raise InvalidTaskError(
                        f"offer_many items are (payload, delay) or Offer, not {item!r}"
                    )
                shard, new_id = self._route(routes, offer, ids[i])
                group = groups.setdefault(shard, ([], [], []))
                group[0].append(i)
                spec = build_offer(self._codec, offer, new_id)
                group[1].append(spec)
                group[2].append(offer.id is None)
                if offer.key is not None and routes.previous:
                    keyed.append((i, offer.key))
                elif offer.id is not None and routes.previous:
                    own_ids[i] = spec.id  # new_id is drawn for the limit key's shard
            if keyed or own_ids:
                groups = await self._regroup_keyed(routes, groups, dict(keyed), own_ids)
        return check_conflicts(await self._write_groups(mode, groups, len(items)))

    async def _write_groups(
        self,
        mode: DedupMode,
        groups: dict[AsyncShard, tuple[list[int], list[OfferSpec], list[bool]]],
        count: int,
    ) -> list[TaskId]:
        """Write each shard's offers (positions, specs, drawn); the ids in item order."""
        await self._register()
        results: list[TaskId] = [TaskId("")] * count
        for shard, (positions, specs, drawn) in groups.items():
            written = await self._write_to(shard, mode, specs, drawn)
            for position, task_id in zip(positions, written, strict=True):
                results[position] = task_id
        return results

    async def _write_to(
        self, shard: AsyncShard, mode: protocol.OfferMode, specs: list[OfferSpec], drawn: list[bool]
    ) -> list[TaskId]:
        """``shard.write_offers``, and if a finished reshard retired that shard (this queue's
        layout was stale: LAYOUT_RETIRED, nothing written), the same offers in the layout
        Redis records now."""
        try:
            return await shard.write_offers(mode, specs, drawn)
        except ServerError as exc:
            if not protocol.layout_retired(exc):
                raise
            return await self._rewrite_retired(mode, specs, drawn)

    async def _rewrite_retired(
        self, mode: protocol.OfferMode, specs: list[OfferSpec], drawn: list[bool]
    ) -> list[TaskId]:
        routes = await self._routes(again=True)
        log.info("delayq: queue %s was resharded: offering to its new layout", self.name)
        groups: dict[AsyncShard, list[int]] = {}
        for i, spec in enumerate(specs):
            key = protocol.spec_key(spec)
            shard = routes.home(protocol.spec_route(spec))
            if key is not None:  # a key still held by a reshard's previous layout stays there
                shard = await self._keyed_shard(routes, key, shard)
            groups.setdefault(shard, []).append(i)
        results: list[TaskId] = [TaskId("")] * len(specs)
        for shard, positions in groups.items():
            written = await shard.write_offers(
                mode, [specs[p] for p in positions], [drawn[p] for p in positions]
            )
            for position, task_id in zip(positions, written, strict=True):
                results[position] = task_id
        return results

    async def _regroup_keyed(
        self,
        routes: _Routes,
        groups: dict[AsyncShard, tuple[list[int], list[OfferSpec], list[bool]]],
        keys: dict[int, str],
        own_ids: dict[int, str] | None = None,
    ) -> dict[AsyncShard, tuple[list[int], list[OfferSpec], list[bool]]]:
        """During a reshard, move each keyed offer whose key the previous layout still holds,
        and each offer of a caller's id whose task lives there, to that shard."""
        regrouped: dict[AsyncShard, tuple[list[int], list[OfferSpec], list[bool]]] = {}
        for shard, (positions, specs, drawn) in groups.items():
            for position, spec, was_drawn in zip(positions, specs, drawn, strict=True):
                key, own_id = keys.get(position), (own_ids or {}).get(position)
                if key is not None:
                    target = await self._keyed_shard(routes, key, shard)
                elif own_id is not None:  # and its caller's id: where a task with it lives
                    limit_key = protocol.spec_limit_key(spec)
                    target = await self._id_shard(routes, own_id, shard, limit_key)
                else:
                    target = shard
                group = regrouped.setdefault(target, ([], [], []))
                group[0].append(position)
                group[1].append(spec)
                group[2].append(was_drawn)
        return regrouped

    def _offer_mode(self, dedup: str | None) -> DedupMode:
        return self._dedup if dedup is None else dedup_mode(dedup)

    async def cancel(self, task_id: str) -> bool:
        """Remove a task that is still waiting; True if it was delayed or ready and is gone.
        With the queue's :class:`Durability`, a cancel that removed a task waits for its
        copies as an offer does (:class:`NotDurable` when they do not confirm)."""
        task_id = protocol.check_id(task_id)
        for shard in (await self._routes()).searched(task_id):
            if await shard.cancel(task_id):
                return True
        return False

    async def reschedule(
        self, task_id: str, delay: Duration | None = None, *, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task's due time; True if it was waiting and now has the new time
        (confirmed by the queue's :class:`Durability`, as a cancel)."""
        kind, value = due_spec(delay, at)
        task_id = protocol.check_id(task_id)
        for shard in (await self._routes()).searched(task_id):
            if await shard.reschedule(task_id, kind, value):
                return True
        return False

    # -- reading ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of the task, or None if the queue holds no task with this id. [H] On a
        queue that keeps task histories, a task that ended is ``done`` or ``cancelled``
        (``ended_at``, ``outcome``) while its history lasts."""
        task_id = protocol.check_id(task_id)
        for shard in (await self._routes()).searched(task_id):
            info = await shard.get(task_id)
            if info is not None:
                return info
        return None

    async def stats(self) -> Stats:
        """Counts per state, read atomically, and the queue's lifetime counters. A sharded
        queue's are its shards' summed (each read atomically, all in one round trip per Redis
        node), each shard's own in ``Stats.shards``."""
        routes = await self._routes()
        if routes.layout is None:
            reply = await routes.current[0].run(Op.STATS, [self._overdue_ms])
            return protocol.stats_from_reply(self.name, reply)
        every = routes.every
        replies = await self._many([shard.stats_call(self._overdue_ms) for shard in every])
        parts = [
            protocol.stats_from_reply(shard.name, reply)
            for shard, reply in zip(every, replies, strict=True)
        ]
        return sharding.merged_stats(self.name, parts)

    async def _many(self, calls: Sequence[Any]) -> list[Any]:
        """Script calls on several shards in one round trip per Redis node; raises the first
        error."""
        self._check_open()
        try:
            replies = await self._runner.many(calls)
        except Exception as exc:
            raise type(exc)(f"queue {self.name!r}: {exc}") from exc
        for reply in replies:
            if isinstance(reply, Exception):
                raise type(reply)(f"queue {self.name!r}: {reply}")
        return replies

    async def dead(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        """Dead-lettered tasks, oldest first, with their last error."""
        check_int(limit, "limit", 0)
        check_int(offset, "offset", 0)
        if limit == 0:
            return []
        every = (await self._routes()).every
        if len(every) == 1:
            rows = await every[0].dead(offset, limit)
        else:
            rows = [row for shard in every for row in await shard.dead(0, offset + limit)]
            rows.sort(key=lambda row: row[1])
            rows = rows[offset : offset + limit]
        return [
            DeadTask(task_id, payload, attempts, to_datetime(dead_ms), error)  # type: ignore[arg-type]
            for task_id, dead_ms, attempts, error, payload in rows
        ]

    async def requeue_dead(self, task_id: str | None = None) -> int:
        """Put one dead task (or all, with no id) back, due now, attempts reset; returns how
        many moved. A task whose dedup key another task now holds stays dead: one that is live,
        or one that finished within its ``key_ttl``."""
        routes = await self._routes()
        if task_id is not None:
            task_id = protocol.check_id(task_id)
            for shard in routes.searched(task_id):
                if shard in routes.previous and await self._held_elsewhere(
                    routes, shard, [task_id]
                ):
                    return 0
                moved = await shard.requeue_dead(task_id)
                if moved:
                    return moved
            return 0
        total = 0
        for shard in routes.every:
            if shard not in routes.previous:
                total += await shard.requeue_dead(None)
                continue
            offset, batch = 0, 1000
            while ids := await shard.dead_ids(offset, batch):
                held = set(await self._held_elsewhere(routes, shard, ids))
                moved = await shard.requeue_ids([i for i in ids if i not in held])
                total += moved
                offset += len(ids) - moved  # the ones left dead stay at the front
                if len(ids) < batch:
                    break
        return total

    async def _held_elsewhere(
        self, routes: _Routes, shard: AsyncShard, ids: Sequence[Any]
    ) -> list[Any]:
        """During a reshard, those of ``ids`` (tasks of a shard of the previous layout) whose
        dedup keys a task in the key's shard of the current layout holds: requeue.lua, which
        sees only its own shard, would put them back beside that task."""
        held = []
        for task_id, key in zip(ids, await shard.dedup_keys(ids), strict=True):
            home = routes.home(key) if key is not None else shard
            if home is not shard and await home.key_taken(key, task_id):  # type: ignore[arg-type]
                held.append(task_id)
        return held

    # -- task history [H] --------------------------------------------------------------------

    async def history(self, task_id: str) -> list[HistoryEvent]:
        """The task's history, oldest event first: offered (by whom), delivered (attempt,
        consumer), retried (the error), acked... ([] if it has none: the queue keeps no
        histories, or it ended longer than the retention ago). See docs/history.md."""
        task_id = protocol.check_id(task_id)
        for shard in (await self._routes()).searched(task_id):
            events = await shard.history(task_id)
            if events:
                return events
        return []

    async def enable_history(
        self,
        retention: Duration = DEFAULT_RETENTION,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_detail_bytes: int = DEFAULT_MAX_DETAIL_BYTES,
    ) -> HistorySettings:
        """Keep task histories on this queue (every client of it records them from now on),
        each for ``retention`` after its task ends (at most 30 days), at most ``max_events``
        events per task and ``max_detail_bytes`` per event's detail; returns the settings."""
        settings = HistorySettings.of(retention, max_events, max_detail_bytes)
        await self._apply_history(await self._all(), settings)
        return settings

    async def disable_history(self) -> bool:
        """Stop keeping task histories; True if the queue kept them. The histories of tasks
        still in the queue are deleted (nothing would record their end); those of tasks that
        ended expire at their retention."""
        return await self._apply_history(await self._all(), False)

    async def history_settings(self) -> HistorySettings | None:
        """How the queue keeps task histories, as Redis has it; None: it keeps none."""
        return await (await self._all())[0].history_settings(["get"])

    async def _apply_history(
        self, shards: Sequence[AsyncShard], wanted: HistorySettings | Literal[False]
    ) -> bool:
        """Write history settings (False: off) to every shard; whether any had them."""
        had = False
        for shard in shards:
            if wanted is False:
                before = await shard.history_settings(["off"])
                if before is not None:
                    await shard.sweep_histories()
            else:
                before = await shard.history_settings(history_set_args(wanted))
            had = had or before is not None
        return had

    # -- flow control [L] --------------------------------------------------------------------

    @property
    def limits(self) -> AsyncLimits:
        """The queue's limits (:class:`AsyncLimits`): ``await q.limits.set(key, Limit(...))``,
        ``get``, ``list``, ``remove``; a task runs under those of its ``limit_key``."""
        return AsyncLimits(self)

    async def pause(self, until: PauseUntil | None = None, note: str | None = None) -> PauseInfo:
        """Hand out nothing until :meth:`resume` (or ``until``: an aware datetime or epoch
        seconds, or a timedelta from now, on the server's clock). Producers keep offering;
        leases in flight run on and their acks land; consumers sleep until the pause ends.
        The pause is kept in Redis (so every consumer sees it, and it survives a restart with
        AOF). Pausing a paused queue replaces its end and note."""
        args = limits.pause_args(until, note)
        infos = [limits.parse_pause(await s.run(Op.LIMIT_PAUSE, args)) for s in await self._all()]
        return infos[0]

    async def resume(self) -> bool:
        """End a pause at once and wake the consumers; True if the queue was paused."""
        replies = [await s.run(Op.LIMIT_PAUSE, ["resume"]) for s in await self._all()]
        return any(int(reply[0]) == 1 for reply in replies)

    async def _all(self) -> list[AsyncShard]:
        return (await self._routes()).every

    # -- consuming --------------------------------------------------------------------------

    async def take(self) -> AsyncTask[PayloadT]:
        """Wait as long as it takes for a due task; rides out Redis outages."""
        while True:
            tasks = await self._poll(1, None)
            if tasks:
                return tasks[0]

    async def poll(self, timeout: Duration = 0.0) -> AsyncTask[PayloadT] | None:
        """A due task, waiting up to ``timeout`` seconds for one; None if none came."""
        tasks = await self._poll(1, duration_ms(timeout, "timeout") / 1000)
        return tasks[0] if tasks else None

    def consume(self, timeout: Duration | None = None) -> AsyncConsumer[PayloadT]:
        """The due tasks one by one, each acked when the next is asked for::

            async with q.consume() as tasks:
                async for task in tasks:
                    await handle(task)

        Leaving the ``async with`` block settles the task in hand: acked on a ``break``,
        retried (with the error and the backoff; :class:`Retry` and :class:`Reject` work as in
        a worker) on an exception; the tasks fetched ahead go back at once. A bare ``async
        for`` acks the same way but cannot see an exception: a task left by one stays leased
        and comes back after its lease. A task acked, retried or released by the loop itself
        is left alone. ``timeout``: stop once no task came for that long (None: wait for
        ever)."""
        return AsyncConsumer(self, None if timeout is None else duration_ms(timeout) / 1000)

    async def poll_many(self, max_tasks: int, timeout: Duration = 0.0) -> list[AsyncTask[PayloadT]]:
        """Up to ``max_tasks`` due tasks in one round trip, waiting up to ``timeout`` seconds
        for the first; an empty list if none came."""
        check_int(max_tasks, "max_tasks", 1, protocol.MAX_BATCH)
        return await self._poll(max_tasks, duration_ms(timeout, "timeout") / 1000)

    async def _poll(self, count: int, timeout: float | None) -> list[AsyncTask[PayloadT]]:
        started = tracing.now_ns()  # 0 without the otel extra: nothing recorded
        tasks = await self._poll_shards(count, timeout)
        tracing.record("receive", self.name, tasks, started)
        return tasks

    async def _poll_shards(self, count: int, timeout: float | None) -> list[AsyncTask[PayloadT]]:
        """Up to ``count`` due tasks of one shard, the shards taken in turn. A shard whose last
        look found nothing due is not looked at again before its next due time, unless its
        channel announces an earlier one; the wait sleeps until the earliest of them."""
        self._check_open()
        routes = await self._routes()
        # Tasks fetched ahead first: they cost no round trip. Every shard's, a shard that a
        # finished reshard retired since included: at-most-once ones are in no Redis now.
        for watch in list(self._watches.values()):
            if watch.ahead.tasks:
                tasks = await self._from_ahead(watch, count)
                if tasks:
                    return tasks
        await self._warn_if_unknown()
        deadline = None if timeout is None else backend.monotonic() + timeout
        for shard in routes.every:
            await shard.notifier.start()
        # Each pass looks at every shard whose quiet time is over; poll(0)'s, at all of them.
        forced = deadline is not None and deadline <= backend.monotonic()
        while True:
            every = routes.every
            for step in range(len(every)):
                index = (self._turn + step) % len(every)
                watch = self._watch(every[index])
                until = watch.quiet_until()
                if forced or until is None or until <= backend.monotonic():
                    # At-most-once, take()/poll() fetch ahead themselves: no ack does it.
                    unleased = count == 1 and self._policy.lease_ms == 0
                    want = watch.ahead.want_unleased(self._fetch_ahead) if unleased else count
                    tasks, _ = await self._fetch(watch, want, deadline)
                    if tasks:
                        self._turn = (index + 1) % len(every)
                        if count == 1:  # take() or poll(): a loop's ack may fetch ahead
                            watch.ahead.consuming = True
                        if len(tasks) > count:
                            now = backend.monotonic()
                            watch.ahead.tasks.extend((t, now) for t in tasks[count:])
                        return tasks[:count]
            forced = False
            now = backend.monotonic()
            if deadline is not None and now >= deadline:
                return []
            if now - routes.read_at >= self._safety_s or any(
                self._watch(shard).heard_unknown for shard in routes.every
            ):
                for shard in routes.every:
                    self._watch(shard).heard_unknown = False
                routes = await self._routes(again=True)  # a reconnect or a reshard: look
                for shard in routes.every:
                    await shard.notifier.start()
            news = _news_since(routes.every)  # before reading the wake times: none is missed
            wakes = [self._watch(shard).quiet_until() for shard in routes.every]
            if None in wakes:
                continue  # news of unknown content, or undecodable tasks buried: look now
            plan = plan_wait(
                backend.monotonic(), cast(list[float], wakes), deadline, backend.TIMER_SLACK
            )
            if plan.timer_s > 0 and await self._shared.bell.wait(news, plan.timer_s):
                continue  # news: an earlier due time, perhaps
            await backend.wait_out(plan.until)

    async def _fetch(
        self,
        watch: Watch,
        count: int,
        deadline: float | None = -1.0,
        acks: Sequence[AsyncTask] = (),
    ) -> tuple[list[AsyncTask[PayloadT]], FetchResult]:
        """One fetch script call on a shard: ack ``acks`` (if any), then lease up to ``count``
        due tasks; the tasks that could be read, and the script's result."""
        self._check_open()
        raws, result = await watch.shard.fetch(
            watch, self._policy, count, deadline, self._insurance_s(), acks
        )
        if result.low_schedules:  # [S] cron schedules short of times ahead
            await self.schedules.refill(watch.shard, result.low_schedules)
        tasks = []
        for raw in raws:
            try:
                if not raw.id_is_utf8:  # written by another client: no handler could use it
                    raise DecodeError(f"task id {printable(raw.id_bytes)} is not UTF-8")
                envelope = self._codec.decode(raw.envelope)
            except Exception as exc:  # whatever stops a task being read must not stop the queue
                await watch.shard.bury_undecodable(self._policy, raw, exc)
                continue
            tasks.append(
                AsyncTask(
                    id=raw.id,
                    payload=envelope.payload,
                    attempts=raw.attempts,
                    due_ms=raw.due_ms,
                    delivered_ms=result.now_ms,
                    priority=raw.priority,
                    headers=dict(envelope.headers),
                    key=envelope.key,
                    lease_token=raw.token,
                    queue=self,
                    _shard=watch.shard,
                    _kept=raw.kept,
                )
            )
        return tasks, result

    def _insurance_s(self) -> float:
        """How long a shard with nothing due may go unlooked at, in case a message was lost:
        the safety interval, times the shards, so that an idle consumer of a sharded queue
        still makes one look per interval, not one per shard."""
        routes = self._shared.routes
        return self._safety_s * (len(routes.every) if routes is not None else 1)

    async def _from_ahead(self, watch: Watch, count: int) -> list[AsyncTask[PayloadT]]:
        """Up to ``count`` of the tasks fetched ahead, each with at least half its lease left
        (a lease that ran lower is extended first; one already lost is skipped)."""
        lease_s = self._policy.lease_ms / 1000
        tasks: list[AsyncTask[PayloadT]] = []
        while watch.ahead.tasks and len(tasks) < count:
            task, leased_at = watch.ahead.tasks.popleft()
            if task.lease_token is not None and backend.monotonic() - leased_at > lease_s / 2:
                try:
                    await self.extend(task, lease_s)
                except LeaseLost:
                    continue
            tasks.append(task)
        return tasks

    async def _hand_back_ahead(self) -> None:
        """Give the tasks fetched ahead back at once (not after their lease), e.g. on close();
        one that cannot be given back now (Redis away) returns after its lease. At-most-once
        tasks left Redis when they were fetched: they are offered again, due now (a crash
        before that loses them, never delivered: at most ``fetch_ahead`` of them)."""
        for watch in self._watches.values():
            unleased = [(t, at) for t, at in watch.ahead.tasks if t.lease_token is None]
            if unleased:
                await self._offer_again(watch.shard, unleased)
            while watch.ahead.tasks:
                task, _ = watch.ahead.tasks.popleft()
                if task.lease_token is None:
                    continue
                try:
                    await self.release(task)
                except Exception as exc:  # whatever it is, the others still go back
                    log.warning(
                        "delayq: could not hand back task %s of %s (%s); it returns after its "
                        "lease", printable(task.id), self.name, printable(str(exc)),
                    )  # fmt: skip

    async def _offer_again(
        self, shard: AsyncShard, fetched: Sequence[tuple[AsyncTask, float]]
    ) -> None:
        """Put at-most-once tasks that were fetched but never handed out (each with the
        monotonic time it came) back on their shard, due now, under their own ids, with the
        key_ttl, limit key and the rest of the ttl their offers gave them."""
        now = backend.monotonic()
        specs = []
        for t, at in fetched:
            kept = protocol.kept_options(t._kept, t.delivered_ms + int((now - at) * 1000))
            again = Offer(t.payload, 0, id=t.id, priority=t.priority, headers=t.headers, key=t.key)
            specs.append(build_offer(self._codec, replace(again, **kept)))
        try:  # on their shard, or where the layout puts them if a reshard retired it
            await self._write_to(shard, protocol.HANDED_BACK, specs, [False] * len(specs))
        except Exception as exc:  # Redis away: they are lost, as a crash would lose them
            log.error(
                "delayq: %d task(s) fetched ahead at-most-once by %s could not be put back "
                "(%s): they are lost", len(specs), self.name, printable(str(exc)),
            )  # fmt: skip

    async def ack(self, task: AsyncTask) -> None:
        """Mark a delivered task done. Raises :class:`LeaseLost` if the lease is no longer
        ours: it expired, and the task is (or was) delivered again, perhaps finished by another
        consumer. An ack resent after a lost reply is recognised and succeeds.

        In a consumer loop (``take()`` or ``poll()``, then ``ack()``) the ack also fetches the
        next due tasks, up to ``fetch_ahead``, in the same round trip: the next ``take()``
        needs none. Tasks fetched ahead are handed out with at least half their lease left,
        and are handed back at once by ``close()``."""
        started = tracing.now_ns()
        acked = await self._ack_one(task, fetch_ahead=True)
        tracing.record("settle", self.name, [task], started)
        if acked is False:
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")

    async def _ack_one(self, task: AsyncTask, *, fetch_ahead: bool) -> bool:
        if task.lease_token is None:
            return True  # at-most-once: the task already left the queue
        shard = self._shard_of(task)
        watch = self._watch(shard)
        want = watch.ahead.want(self._fetch_ahead, self._policy.lease_ms) if fetch_ahead else 0
        if (
            want == 0
            or task.queue is not self
            or watch.ahead.tasks
            or (self._durability is not None and self._durability.after_ack)
            or (watch.quiet_until() or 0.0) > backend.monotonic()  # nothing due to fetch yet
        ):
            self._check_open()
            (acked,) = await shard.ack([task])  # the loop's common step: straight to its shard
            if acked:
                object.__setattr__(task, "_settled", True)
            return acked
        tasks, result = await self._fetch(watch, want, acks=[task])
        now = backend.monotonic()
        watch.ahead.tasks.extend((t, now) for t in tasks)
        if result.acked[0]:
            object.__setattr__(task, "_settled", True)
        return result.acked[0]

    async def _ack_in_loop(self, task: AsyncTask) -> bool | AckPosted:
        """consume()'s ack of the task it handed out last. When the next task is at hand
        (fetched ahead), the ack is written without waiting for its reply (read on the loop's
        next step): Redis runs it while the loop handles that task. Else as :meth:`ack`."""
        after_ack = self._durability is not None and self._durability.after_ack
        if task.lease_token is not None and task.queue is self and not after_ack:
            shard = self._shard_of(task)
            if self._watch(shard).ahead.tasks:
                self._check_open()
                posted = await shard.post_ack(task)
                # Not written (the connection busy or away): acked now, not at the next step.
                return posted if posted.posted.written else await posted.acked()
        return await self._ack_one(task, fetch_ahead=True)

    async def ack_many(self, tasks: Sequence[AsyncTask]) -> list[bool]:
        """Ack many tasks in one round trip per Redis node, whatever their shards; False where
        the lease was lost."""
        started = tracing.now_ns()
        acked = await self._ack_many(tasks)
        tracing.record("settle", self.name, tasks, started)
        return acked

    async def _ack_many(self, tasks: Sequence[AsyncTask]) -> list[bool]:
        leased = [t for t in tasks if t.lease_token is not None]
        groups: dict[AsyncShard, list[AsyncTask]] = {}
        for task in leased:
            groups.setdefault(self._shard_of(task), []).append(task)
        self._check_open()
        if len(groups) <= 1 or (self._durability is not None and self._durability.after_ack):
            # One shard, or writes that each wait for their replicas on their connection.
            acked: dict[int, bool] = {}
            for shard, group in groups.items():
                acked.update(zip(map(id, group), await shard.ack(group), strict=True))
        else:
            calls, batches = [], []
            for shard, group in groups.items():
                for start, (keys, args) in zip(
                    range(0, len(group), protocol.MAX_BATCH), shard.ack_calls(group), strict=True
                ):
                    calls.append((shard.variant(Op.ACK), keys, args))
                    batches.append((shard, group[start : start + protocol.MAX_BATCH]))
            acked = {}
            for (shard, batch), (sent, keys, args), reply in zip(
                batches, calls, await self._many(calls), strict=True
            ):
                if shard.refused(sent, [reply]):  # the queue uses a feature: the full ack
                    reply = await shard.run(Op.ACK, args, keys=keys)
                acked.update(zip(map(id, batch), protocol.parse_ack(reply), strict=True))
        return _settled(tasks, [acked[id(t)] for t in leased])

    async def nack(self, task: AsyncTask, delay: Duration | None = None) -> None:
        """Give a task back: delivered again now, or after ``delay``. Counts as an attempt
        (so a task nacked ``max_attempts`` times is dead-lettered)."""
        await self._give_back(task, "retry", duration_ms(delay) if delay is not None else 0, "")

    async def retry(
        self, task: AsyncTask, delay: Duration | None = None, *, error: str | None = None
    ) -> None:
        """Fail this attempt: deliver again after ``delay`` or, if None, the backoff policy;
        dead-letter after ``max_attempts``. ``error`` is kept as the task's last error."""
        await self._give_back(
            task, "retry", duration_ms(delay) if delay is not None else -1, error or ""
        )

    async def release(self, task: AsyncTask) -> None:
        """Hand back an unstarted task (e.g. on shutdown) without counting an attempt."""
        await self._give_back(task, "release", 0, "")

    async def throttle(self, task: AsyncTask, retry_after: Duration) -> None:
        """[L] The downstream is rate limited (what a handler's :class:`RateLimited` does):
        the task's ``limit_key`` (none: the whole queue) starts nothing for ``retry_after``
        seconds and the task waits first in line for it; the attempt is not counted."""
        wait_ms = duration_ms(retry_after, "retry_after")
        await self._give_back(task, "throttle", wait_ms, "", due_ms=task.due_ms)

    async def reject(self, task: AsyncTask, error: str) -> None:
        """Dead-letter a task now, with ``error`` as the reason."""
        await self._give_back(task, "dead", 0, error)

    async def _give_back(
        self, task: AsyncTask, outcome: str, delay_ms: int, error: str, due_ms: int | None = None
    ) -> None:
        if task.lease_token is None:
            return  # at-most-once: the task already left the queue
        shard = self._shard_of(task)
        self._check_open()
        if not await shard.give_back(
            self._policy, task.id, task.lease_token, outcome, delay_ms, error, due_ms
        ):
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")
        object.__setattr__(task, "_settled", True)

    async def extend(self, task: AsyncTask, seconds: Duration) -> datetime:
        """Keep the lease for ``seconds`` from now; returns the new expiry. Raises
        :class:`LeaseLost` if the lease already expired or moved on."""
        if task.lease_token is None:
            raise LeaseLost("tasks taken at-most-once have no lease to extend")
        ms = duration_ms(seconds, "seconds", allow_zero=False)
        shard = self._shard_of(task)
        self._check_open()
        expiry = await shard.extend(task.id, task.lease_token, ms)
        if expiry is None:
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")
        return to_datetime(expiry)  # type: ignore[return-value]

    def _shard_of(self, task: AsyncTask) -> AsyncShard:
        """The shard that leased ``task``: this queue's engine for it, whichever queue object
        (of the same queue) delivered it."""
        shard = task._shard
        if shard is None:  # a task made by hand: it can only be of an unsharded queue
            routes = self._shared.routes
            if routes is None or routes.layout is None:
                return self._engine(self.name)
        elif shard is self._shared.engines.get(shard.name):
            return shard
        elif shard.keys.prefix == self._keys.prefix and sharding.is_part_of(shard.name, self.name):
            return self._engine(shard.name)
        raise InvalidTaskError(f"task {task.id} was not delivered by queue {self.name!r}")

    # -- plumbing ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or (self._base is not None and self._base._closed):
            raise QueueClosed(f"queue {self.name!r} is closed")

    # -- administration ---------------------------------------------------------------------

    async def tasks(
        self, state: TaskState | str, limit: int = 100, offset: int = 0
    ) -> list[TaskInfo]:
        """One page of the tasks in ``state``, in the order they leave it: ``ready`` and
        ``delayed`` by due time, ``inflight`` by lease expiry, ``dead`` oldest first (ties by
        priority). Each page is read in one step per shard and costs O(log N + limit): no
        scans."""
        try:
            wanted = TaskState(state)
            if wanted not in HELD_STATES:  # [H] done and cancelled tasks are gone
                raise ValueError(state)
        except ValueError as exc:
            names = ", ".join(s.value for s in HELD_STATES)
            raise ConfigError(f"state must be one of {names}, got {state!r}") from exc
        check_int(limit, "limit", 0, 10_000)
        check_int(offset, "offset", 0)
        if limit == 0:
            return []
        every = (await self._routes()).every
        if len(every) == 1:
            return await every[0].tasks(wanted, offset, limit)
        rows = [row for shard in every for row in await shard.tasks(wanted, 0, offset + limit)]
        rows.sort(key=_leaving_order)
        return rows[offset : offset + limit]

    async def purge(self, states: Iterable[TaskState | str] | TaskState | str = ("dead",)) -> int:
        """Delete every task in ``states`` (default: the dead letters) and release their dedup
        keys; returns how many were deleted. Works in batches of 1000, so Redis is never busy
        for long however many there are. Purging ``inflight`` takes the leases away: those
        consumers' ack/nack/extend raise :class:`LeaseLost`."""
        if isinstance(states, str):
            states = (states,)
        try:
            wanted = sorted({TaskState(s).value for s in states})
            if not set(wanted) <= {s.value for s in HELD_STATES}:  # [H] gone already
                raise ValueError(states)
        except (ValueError, TypeError) as exc:
            names = ", ".join(s.value for s in HELD_STATES)
            raise ConfigError(f"states must be among {names}, got {states!r}") from exc
        if not wanted:
            raise ConfigError("purge needs at least one state")
        return sum([await shard.purge(wanted) for shard in (await self._routes()).every])


async def announce_layout(conn: runner.Runner, keys: QueueKeys) -> None:
    """Publish a layout change on a (sub-)queue's channel: its consumers read the layout again.
    A hint only (consumers also read it every safety interval), so a failure is ignored."""
    command = "SPUBLISH" if keys.sharded_channel else "PUBLISH"
    try:
        await conn.command(command, keys.channel, b"layout")
    except Exception as exc:  # e.g. Redis 6.2 has no SPUBLISH
        log.debug("delayq: could not announce a layout change on %s: %s", keys.channel, exc)
