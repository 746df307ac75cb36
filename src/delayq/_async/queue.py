"""AsyncDelayQueue: the asyncio front end.

The sync ``DelayQueue`` in ``_sync/queue.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, NamedTuple, Self, cast

from .._core import protocol, sharding
from .._core.codecs import PayloadT, PayloadType, check_codec
from .._core.connection import Topology
from .._core.durability import Durability
from .._core.envelope import EnvelopeCodec
from .._core.keys import QueueKeys
from .._core.models import (
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
    TaskId,
    build_offer,
    build_plain_offer,
    build_plain_offers,
    check_conflicts,
    task_ids_of,
)
from .._core.protocol import FetchResult, OfferSpec, Policy, RawTask
from .._core.scripts import Op
from .._core.text import printable, utf8_safe
from .._core.timing import Duration, due_spec, duration_ms
from ..exceptions import (
    ConfigError,
    DecodeError,
    InvalidTaskError,
    LeaseLost,
    NotDurable,
    QueueClosed,
    RedisUnavailable,
    ServerError,
)
from . import backend, runner
from .consumer import AsyncConsumer

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

    async def extend(self, seconds: Duration) -> datetime:
        """Extend the lease; see :meth:`AsyncDelayQueue.extend`."""
        return await self._queue().extend(self, seconds)


def _acked(reply: Sequence[Any]) -> list[bool]:
    """An ack script's reply: True where the task was acked, False where its lease was lost."""
    return [int(status) != 0 for status in reply]


def _settled(tasks: Sequence[AsyncTask], acked: list[bool]) -> list[bool]:
    """Per task, whether its ack went through (``acked`` holds the leased ones', in order; a
    task taken at-most-once has nothing to ack), marking those that did as settled."""
    status = iter(acked)
    results = [next(status) if t.lease_token is not None else True for t in tasks]
    for task, ok in zip(tasks, results, strict=True):
        if ok:
            object.__setattr__(task, "_settled", True)
    return results


def _timer_left(until: float, wake_at: float) -> float:
    """Seconds to wait by the timer: a due time (``until == wake_at``) to TIMER_SLACK before
    it, the rest yielded away by backend.wait_out; the caller's own timeout in full."""
    slack = backend.TIMER_SLACK if until == wake_at else 0.0
    return until - backend.monotonic() - slack


class _Quiet(NamedTuple):
    """What an empty look at Redis found: nothing due before ``wake_at`` (monotonic), unless
    the notifier has news after ``mark``."""

    mark: int
    wake_at: float
    fetched_at: float
    result: FetchResult


@dataclass(eq=False)
class _Ahead:
    """Tasks a consumer loop's ack fetched ahead for the next take(), with when they were
    leased (monotonic), and the loop's pace, which bounds how many are worth fetching."""

    tasks: deque[tuple[Any, float]] = field(default_factory=deque)
    consuming: bool = False  # take()/poll() handed a task out: acks may fetch ahead
    last_ack: float = 0.0
    pace: float | None = None  # seconds between acks, smoothed

    def want(self, prefetch: int, lease_ms: int) -> int:
        """How many tasks the next ack should fetch ahead: as many as the loop hands out in
        a quarter of the lease at its pace (so each keeps at least half of it), at least one
        and at most ``prefetch``; none outside a take()/poll() loop."""
        if not self.consuming or prefetch == 0 or lease_ms == 0:
            return 0
        now = time.monotonic()
        if self.last_ack:
            gap = now - self.last_ack
            self.pace = gap if self.pace is None else 0.8 * self.pace + 0.2 * gap
        self.last_ack = now
        if self.pace is None:
            return 1
        return max(1, min(prefetch, int(lease_ms / 4000 / max(self.pace, 1e-6))))


class AsyncDelayQueue(Generic[PayloadT]):
    """A delayed queue on Redis: tasks are delivered at their due time to one consumer each.

    Args:
        name: queue name (the Redis hash tag of all its keys).
        redis: a URL (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``,
            ``redis+cluster://``), a ``redis.asyncio`` ``Redis`` (a Sentinel ``master_for``
            client too) or ``RedisCluster`` client (not ``decode_responses``), or None for
            ``$REDIS_URL`` (``redis://127.0.0.1:6379/0`` when it is not set).
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
            message; an idle consumer makes one script call per interval.
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
        prefetch: in a ``take()``/``poll()`` then ``ack()`` loop, how many due tasks an ack
            may fetch ahead in its own round trip (fewer when the loop is slow: each keeps at
            least half its lease); 0: none, two round trips per task. ``close()`` hands them
            back at once.
        shards: spread the queue over this many sub-queues, each under its own hash tag (so
            on its own cluster slot, spread over the masters); None for one. Opening a queue
            with another count than Redis recorded for it is a :class:`ConfigError`.
    """

    # The sharded front end (``sharded.py``) registers itself here: a queue made with
    # ``shards=N`` is one of those, without this module importing the layer above it.
    _sharded_class: type | None = None

    def __new__(cls, *args: Any, shards: int | None = None, **options: Any) -> Any:
        if shards is not None and cls is AsyncDelayQueue and cls._sharded_class is not None:
            return object.__new__(cls._sharded_class)
        return object.__new__(cls)

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
        prefetch: int = 8,
        shards: int | None = None,
    ) -> None:
        if shards is not None and type(self) is AsyncDelayQueue:
            raise ConfigError("shards= needs the sharded front end (import delayq)")
        self._keys = QueueKeys(prefix, name)
        self._key_list = self._keys.all
        self._offer_one_keys = self._keys.offer_one
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
            raise ConfigError(
                f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}"
            )
        if not isinstance(ack, bool):
            raise ConfigError(f"ack must be True or False, got {ack!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= 100:
            raise ConfigError(f"prefetch must be an int from 0 to 100, got {prefetch!r}")
        self._prefetch = prefetch
        try:
            self._dedup = DedupMode(dedup)
            lease_ms = duration_ms(visibility_timeout, "visibility_timeout", allow_zero=False)
            self._safety_s = (
                duration_ms(safety_interval, "safety_interval", allow_zero=False) / 1000
            )
            reconnect_s = (
                None
                if reconnect_timeout is None
                else duration_ms(reconnect_timeout, "reconnect_timeout") / 1000
            )
            self._overdue_ms = duration_ms(overdue_after, "overdue_after")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self._codec = EnvelopeCodec(
            check_codec(codec),
            PayloadType(payload_type) if payload_type is not None else None,
            max_payload_bytes,
        )
        self._policy = Policy(lease_ms if ack else 0, max_attempts, retry_backoff or Backoff())
        if durability is not None and not isinstance(durability, Durability):
            raise ConfigError(f"durability must be a Durability, got {durability!r}")
        self._durability = durability
        self._owns_runner = not isinstance(redis, runner.Runner)
        self._runner = runner.connect(
            redis,
            f"delayq:{name}",
            reconnect_s,
            label=name,
            wait_s=durability.timeout if durability else 0.0,
        )
        # How long a call's receipt lives, so that a resend is answered from it: longer than
        # any retry of ours (reconnect_timeout) plus redis-py's own.
        self._receipt_ms = int(self._runner.reconnect_s * 1000) + 5000
        if self._runner.topology is Topology.CLUSTER:  # wake-ups on the slot's node only
            self._keys = dataclasses.replace(self._keys, sharded_channel=True)
            self._key_list = self._keys.all
            self._offer_one_keys = self._keys.offer_one
        self._notifier = backend.Notifier(self._runner.client, self._keys.channel)
        self._quiet: _Quiet | None = None
        self._registered = False
        self._closed = False
        self._base: AsyncDelayQueue[PayloadT] | None = None  # set on a view (with_policy)
        self._ahead = _Ahead()
        self._views: weakref.WeakSet[AsyncDelayQueue[PayloadT]] = weakref.WeakSet()

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._keys.name

    @property
    def keys(self) -> QueueKeys:
        """The queue's Redis key names."""
        return self._keys

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
        policy = self._policy.overridden(self.name, visibility_timeout, max_attempts, retry_backoff)
        view = copy.copy(self)
        view._policy = policy
        view._base = self._base or self
        view._owns_runner = False
        view._quiet = None
        view._closed = False
        view._ahead = _Ahead()
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
        await self._notifier.close()
        if self._owns_runner:
            await self._runner.close()

    async def __aenter__(self) -> AsyncDelayQueue[PayloadT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def ping(self) -> float:
        """Check that Redis answers, retrying a lost connection up to the reconnect timeout;
        the seconds the answer took. Raises :class:`RedisUnavailable` (at once for a host
        name that does not resolve or a TLS handshake refused)."""
        self._check_open()
        started = backend.monotonic()
        await self._runner.command("PING")
        return backend.monotonic() - started

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
        """Schedule ``payload`` after ``delay`` seconds (or at ``at``); return the task id.

        The id is a :class:`TaskId`, a ``str`` whose ``outcome`` says what happened:
        ``created``, or, with ``key``, ``existing`` (another live task holds the key and is
        kept; its id is returned, ``dedup="keep"``) or ``replaced`` (the pending task holding
        the key got this payload and due time, ``dedup="replace"``). ``key_ttl`` keeps the key
        taken for that long after the task completes. With ``id``, an offer repeated after a
        timeout is a no-op (``existing``); if a task with other content (payload, headers,
        priority, key) holds the id, it is kept and :class:`TaskIdConflict` is raised. ``ttl``
        drops the task if it is not delivered within that long after its due time. Nothing is
        written if any argument is invalid.
        """
        plain = key is None and id is None and at is None and ttl is None and key_ttl is None
        if plain and priority == 0 and not headers:  # the common case, on a shorter path
            self._offer_mode(dedup)
            return await self._offer_plain(build_plain_offer(self._codec, payload, delay))
        offer = Offer(payload, delay, at, key, id, priority, headers, ttl, key_ttl)
        spec = build_offer(self._codec, offer)
        written = await self._write_offers(self._offer_mode(dedup), [spec], [id is None])
        return check_conflicts(written)[0]

    async def _offer_plain(self, spec: OfferSpec) -> TaskId:
        """Offer a task with no options but its delay, whose id the queue drew: one short
        script (offer_one.lua), the producer's hot path."""
        await self._register()
        for _ in range(protocol.ID_DRAWS):
            if self._durability is None:
                status = await self._run(Op.OFFER_ONE, list(spec[:3]), keys=self._offer_one_keys)
            else:
                (status,) = await self._write(
                    Op.OFFER_ONE, [list(spec[:3])], [spec.id], keys=self._offer_one_keys
                )
            if status != protocol.ID_TAKEN:  # 0: an earlier attempt wrote it, reply lost
                return TaskId(spec.id)
            spec = spec._replace(id=protocol.new_task_id())
        raise protocol.no_free_id()

    async def offer_many(
        self, items: Iterable[Offer | tuple[Any, Duration | None]], *, dedup: str | None = None
    ) -> list[TaskId]:
        """Schedule many tasks in few round trips; ``items`` are ``(payload, delay)`` pairs or
        :class:`Offer` objects. Every item is validated and encoded before anything is written.
        Returns the ids in order, each a :class:`TaskId` saying what happened as in
        :meth:`offer`. If some items' own ids are held by tasks with other content, every other
        item is still written, then :class:`TaskIdConflict` is raised with all the results."""
        # Encode everything first: one bad item raises before anything is written.
        items = list(items)
        ids = protocol.new_task_ids(len(items)) if items else []
        if all(type(item) is tuple and len(item) == 2 for item in items):  # the common call
            specs = build_plain_offers(self._codec, cast(list[tuple[Any, Any]], items), ids)
        else:
            specs = [self._spec(item, new_id) for item, new_id in zip(items, ids, strict=True)]
        mode = self._offer_mode(dedup)
        drawn = [not (isinstance(item, Offer) and item.id is not None) for item in items]
        return check_conflicts(await self._write_offers(mode, specs, drawn)) if specs else []

    def _spec(self, item: Offer | tuple[Any, Duration | None], new_id: str) -> OfferSpec:
        if isinstance(item, tuple) and len(item) == 2:
            return build_plain_offer(self._codec, *item, new_id)
        if isinstance(item, Offer):
            return build_offer(self._codec, item, new_id)
        raise InvalidTaskError(f"offer_many items are (payload, delay) or Offer, not {item!r}")

    def _offer_mode(self, dedup: str | None) -> DedupMode:
        try:
            return self._dedup if dedup is None else DedupMode(dedup)
        except ValueError as exc:
            raise ConfigError(f"dedup must be 'keep' or 'replace', got {dedup!r}") from exc

    async def _write_offers(
        self, mode: DedupMode, specs: Sequence[OfferSpec], drawn: Sequence[bool], draws: int = 1
    ) -> list[TaskId]:
        """Offer ``specs`` in order and say what each did. ``drawn[i]``: the queue drew
        ``specs[i].id``, so if another task holds it (two producers drew the same id) it draws
        a new one and offers that task again."""
        await self._register()
        chunks = [
            specs[start : start + protocol.OFFER_CHUNK]
            for start in range(0, len(specs), protocol.OFFER_CHUNK)
        ]
        # In order, on one connection: a later task with the same key or id must lose.
        arg_lists = [protocol.offer_args(mode, chunk) for chunk in chunks]
        replies = await self._write(Op.OFFER, arg_lists, [spec.id for spec in specs])
        ids, statuses = task_ids_of(replies, specs, drawn)
        taken = []
        if protocol.ID_TAKEN in statuses:  # rare: skip the scan when nothing was taken
            taken = [i for i, st in enumerate(statuses) if st == protocol.ID_TAKEN and drawn[i]]
        if taken:
            if draws >= protocol.ID_DRAWS:
                raise protocol.no_free_id()
            fresh = protocol.new_task_ids(len(taken))
            again = [specs[i]._replace(id=new_id) for i, new_id in zip(taken, fresh, strict=True)]
            settled = await self._write_offers(mode, again, [True] * len(again), draws + 1)
            for i, task_id in zip(taken, settled, strict=True):
                ids[i] = task_id
        return ids

    async def _register(self) -> None:
        if not self._registered:
            self._check_open()
            if self._durability is not None and self._durability.aof:
                try:  # before anything is written: a server without it refuses the probe
                    await self._runner.command("WAITAOF", 1, 0, 1)
                except ServerError as exc:
                    raise ConfigError(
                        "Durability(aof=True) needs WAITAOF (Redis 7.2+ or Valkey 8) and "
                        f"appendonly yes; {self._runner.where} refused it: {exc}"
                    ) from exc
            counts = sharding.shards_key(self._keys.prefix)
            recorded = sharding.recorded_count(
                await self._runner.command("HGET", counts, self.name)
            )
            if recorded is not None:
                raise ConfigError(
                    f"queue {self.name!r} is sharded in Redis ({recorded} shards): "
                    f"open it with shards={recorded}"
                )
            await self._runner.command("SADD", self._keys.registry, self.name)
            self._registered = True

    async def _write(
        self,
        op: Op,
        arg_lists: list[list[Any]],
        task_ids: Sequence[str],
        *,
        keys: Sequence[str] | None = None,
    ) -> list[Any]:
        """Run a writing script once per argument list, in order, on one connection; with a
        :class:`Durability`, followed on that connection by its WAIT, and a shortfall raised
        as :class:`NotDurable` (or logged). Resending is safe as in :meth:`_run`."""
        self._check_open()
        durability = self._durability
        tail = durability.commands() if durability is not None else ()
        try:
            replies = await self._runner.batch(op, keys or self._key_list, arg_lists, tail=tail)
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self.name!r}: {exc}") from exc
        if durability is None:
            return replies
        scripts = replies[: len(arg_lists)]
        short = durability.shortfall(replies[len(arg_lists) :])
        if short is not None:
            message = (
                f"queue {self.name!r}: {len(task_ids)} task(s) written but not confirmed "
                f"within {durability.timeout:g} s: {short}"
            )
            if durability.on_shortfall == "raise":
                raise NotDurable(message, [str(task_id) for task_id in task_ids])
            log.warning("delayq: %s", message)
        return scripts

    async def cancel(self, task_id: str) -> bool:
        """Remove a task that is still waiting; True if it was delayed or ready and is gone."""
        reply = await self._run(
            Op.CANCEL,
            [self._receipt_ms, protocol.check_id(task_id)],
            keys=(*self._key_list, self._keys.receipt("cancel", protocol.new_nonce())),
        )
        return bool(int(reply[0]))

    async def reschedule(
        self, task_id: str, delay: Duration | None = None, *, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task's due time; True if it was waiting and now has the new time."""
        kind, value = due_spec(delay, at)
        reply = await self._run(Op.RESCHEDULE, [protocol.check_id(task_id), kind, value])
        return bool(int(reply[0]))

    # -- reading ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of the task, or None if the queue holds no task with this id."""
        info = protocol.parse_info(await self._run(Op.INFO, [protocol.check_id(task_id)]))
        if not info.state:
            return None
        state = TaskState(info.state)
        if (
            state is TaskState.DELAYED
            and info.score_ms is not None
            and info.score_ms <= info.now_ms
        ):
            state = TaskState.READY
        return self._task_info(
            task_id, state, info.score_ms, info.attempts, info.envelope, info.error,
            info.expires_ms,
        )  # fmt: skip

    def _task_info(
        self,
        task_id: str,
        state: TaskState,
        score_ms: int | None,
        attempts: int,
        envelope: bytes | None,
        error: str | None,
        expires_ms: int | None,
    ) -> TaskInfo:
        """A TaskInfo from stored parts; ``score_ms`` means the due time, lease expiry or time
        of death, by state. An undecodable envelope shows as its error, never raises."""
        payload: Any = None
        headers: dict[str, str] = {}
        priority, key = 0, None
        if envelope:
            try:
                decoded = self._codec.decode(envelope)
                payload, headers = decoded.payload, dict(decoded.headers)
                priority, key = decoded.priority, decoded.key
            except DecodeError as exc:
                error = error or f"undecodable: {exc}"
        when = to_datetime(score_ms)
        return TaskInfo(
            id=task_id,
            state=state,
            payload=payload,
            attempts=attempts,
            priority=priority,
            headers=headers,
            key=key,
            due_at=when if state in (TaskState.DELAYED, TaskState.READY) else None,
            lease_expires_at=when if state is TaskState.INFLIGHT else None,
            dead_at=when if state is TaskState.DEAD else None,
            expires_at=to_datetime(expires_ms),
            last_error=error,
        )

    async def stats(self) -> Stats:
        """Counts per state, read atomically, and the queue's lifetime counters."""
        return protocol.stats_from_reply(self.name, await self._run(Op.STATS, [self._overdue_ms]))

    async def dead(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        """Dead-lettered tasks, oldest first, with their last error."""
        if not isinstance(limit, int) or not isinstance(offset, int) or limit < 0 or offset < 0:
            raise ConfigError(f"limit and offset must be ints >= 0, got {limit!r}, {offset!r}")
        if limit == 0:
            return []
        rows = protocol.parse_dead(await self._run(Op.DEAD, [offset, limit]))
        result = []
        for task_id, dead_ms, attempts, error, envelope in rows:
            try:
                payload = self._codec.decode(envelope).payload if envelope else None
            except DecodeError:
                payload = envelope  # keep the raw bytes visible: that is why it is here
            result.append(DeadTask(task_id, payload, attempts, to_datetime(dead_ms), error))  # type: ignore[arg-type]
        return result

    async def requeue_dead(self, task_id: str | None = None) -> int:
        """Put one dead task (or all, with no id) back, due now, attempts reset; returns how
        many moved. A task whose dedup key another live task now holds stays dead."""
        if task_id is not None:
            reply = await self._run(Op.REQUEUE, [1, 0, protocol.check_id(task_id)])
            return int(reply[0])
        total, offset, batch = 0, 0, 1000
        while True:
            reply = await self._run(Op.REQUEUE, [batch, offset])
            moved, examined = int(reply[0]), int(reply[1])
            total += moved
            offset += examined - moved  # the ones left dead stay at the front
            if examined < batch:
                return total

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
        if not isinstance(max_tasks, int) or not 1 <= max_tasks <= protocol.MAX_BATCH:
            raise ConfigError(
                f"max_tasks must be an int from 1 to {protocol.MAX_BATCH}, got {max_tasks!r}"
            )
        return await self._poll(max_tasks, duration_ms(timeout, "timeout") / 1000)

    async def _poll(self, count: int, timeout: float | None) -> list[AsyncTask[PayloadT]]:
        self._check_open()
        if self._ahead.tasks:
            tasks = await self._from_ahead(count)
            if tasks:
                return tasks
        deadline = None if timeout is None else backend.monotonic() + timeout
        await self._notifier.start()
        while True:
            quiet, now = self._quiet, backend.monotonic()
            if (
                quiet is not None
                and now < quiet.wake_at
                and (deadline is None or now < deadline)  # a timeout of 0 means "look now"
                and self._notifier.mark() == quiet.mark
            ):
                # An earlier look found nothing due before wake_at, and no message came since:
                # looking again now would only cost Redis a script call.
                mark, wake_at, fetched_at, result = quiet
            else:
                tasks, result = await self._fetch(count, deadline)
                if tasks:
                    if count == 1:  # take() or poll(): a loop's ack may fetch ahead for it
                        self._ahead.consuming = True
                    return tasks
                if result.tasks:
                    continue  # every one was undecodable and is dead-lettered: look again now
                assert self._quiet is not None  # an empty look planned the next one
                mark, wake_at, fetched_at, result = self._quiet
                if deadline is not None and backend.monotonic() >= deadline:
                    return []
            # Sleep until the earliest due time, moving the alarm earlier when a message
            # announces an earlier task; any doubt means look at Redis again.
            until = wake_at if deadline is None else min(wake_at, deadline)
            while (remaining := _timer_left(until, wake_at)) > 0:
                news = await self._notifier.wait(mark, remaining)
                if news is None:
                    break
                mark, due_ms = news
                if due_ms is None:
                    wake_at = until = backend.monotonic()
                    break
                wake_at = min(wake_at, fetched_at + result.seconds_until(due_ms))
                until = min(until, wake_at)
            await backend.wait_out(until)
            if backend.monotonic() < wake_at:  # the caller's timeout ran out first
                self._quiet = _Quiet(mark, wake_at, fetched_at, result)
                return []
            self._quiet = None

    async def _fetch(
        self,
        count: int,
        deadline: float | None = -1.0,
        acks: Sequence[AsyncTask] = (),
    ) -> tuple[list[AsyncTask[PayloadT]], FetchResult]:
        """One fetch script call: ack ``acks`` (if any), then lease up to ``count`` due tasks.
        A look that leases nothing records when the next one is worth making (``_quiet``)."""
        mark = self._notifier.mark()
        args = protocol.fetch_args(self._policy, count, self._receipt_ms)
        for task in acks:
            args += (task.id, task.lease_token)
        sent_at = backend.monotonic()
        result = await self._run(
            Op.FETCH,
            args,
            deadline=deadline,
            parse=True,
            keys=(*self._key_list, self._keys.receipt("fetch", args[2])),
        )
        # The server read its clock about halfway through the round trip: plan from there.
        received_at = backend.monotonic()
        fetched_at = (sent_at + received_at) / 2 if received_at - sent_at < 0.05 else received_at
        self._quiet = None
        tasks = await self._accept(result)
        if not result.tasks:
            wake_at = fetched_at + self._safety_s
            if result.next_wake_ms is not None:
                wake_at = min(wake_at, fetched_at + result.seconds_until(result.next_wake_ms))
            self._quiet = _Quiet(mark, wake_at, fetched_at, result)
        return tasks, result

    async def _from_ahead(self, count: int) -> list[AsyncTask[PayloadT]]:
        """Up to ``count`` of the tasks fetched ahead, each with at least half its lease left
        (a lease that ran lower is extended first; one already lost is skipped)."""
        lease_s = self._policy.lease_ms / 1000
        tasks: list[AsyncTask[PayloadT]] = []
        while self._ahead.tasks and len(tasks) < count:
            task, leased_at = self._ahead.tasks.popleft()
            if backend.monotonic() - leased_at > lease_s / 2:
                try:
                    await self.extend(task, lease_s)
                except LeaseLost:
                    continue
            tasks.append(task)
        return tasks

    async def _hand_back_ahead(self) -> None:
        """Give the tasks fetched ahead back at once (not after their lease), e.g. on close();
        one that cannot be given back now (Redis away) returns after its lease."""
        while self._ahead.tasks:
            task, _ = self._ahead.tasks.popleft()
            try:
                await self.release(task)
            except Exception as exc:  # whatever it is, the others still go back
                log.warning(
                    "delayq: could not hand back task %s of %s (%s); it returns after its lease",
                    printable(task.id), self.name, printable(str(exc)),
                )  # fmt: skip

    def _quiet_until(self) -> float | None:
        """When this queue must next be looked at (monotonic), from its last empty look and
        the announcements since; None: look now."""
        quiet = self._quiet
        if quiet is None:
            return None
        if self._notifier.mark() != quiet.mark:
            mark, due_ms = self._notifier.news(quiet.mark)
            if due_ms is None:
                self._quiet = None
                return None
            wake_at = min(quiet.wake_at, quiet.fetched_at + quiet.result.seconds_until(due_ms))
            quiet = self._quiet = quiet._replace(mark=mark, wake_at=wake_at)
        return quiet.wake_at

    def _ring(self, bell: backend.Bell) -> None:
        """Let ``bell`` wake a waiter on news from this queue's channel (before it listens)."""
        self._notifier = backend.Notifier(self._runner.client, self._keys.channel, bell)

    async def _accept(self, result: FetchResult) -> list[AsyncTask[PayloadT]]:
        tasks = []
        for raw in result.tasks:
            try:
                if not raw.id_is_utf8:  # written by another client: no handler could use it
                    raise DecodeError(f"task id {printable(raw.id_bytes)} is not UTF-8")
                envelope = self._codec.decode(raw.envelope)
            except Exception as exc:  # whatever stops a task being read must not stop the queue
                await self._bury_undecodable(raw, exc)
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
                )
            )
        return tasks

    async def _bury_undecodable(self, raw: RawTask, exc: Exception) -> None:
        """Dead-letter a delivered task that cannot be read, addressed by its id's raw bytes
        (the id itself may be what cannot be read), its envelope kept as stored."""
        try:
            reason = str(exc)
        except Exception:  # an exception whose __str__ raises still has a type
            reason = ""
        reason = f"{type(exc).__name__}: {reason}" if not isinstance(exc, DecodeError) else reason
        log.error(
            "delayq: task %s in %s cannot be decoded, dead-lettered: %s",
            printable(raw.id_bytes), self.name, printable(reason),
        )  # fmt: skip
        error = f"undecodable: {reason}"  # nack_args and the BURY line make it valid UTF-8
        if raw.token is None:
            await self._run(
                Op.BURY, [raw.id_bytes, raw.envelope, 9 - raw.priority, utf8_safe(error)]
            )
        else:
            await self._run(
                Op.NACK,
                protocol.nack_args(self._policy, raw.id_bytes, raw.token, "undecodable", 0, error),
            )

    async def ack(self, task: AsyncTask) -> None:
        """Mark a delivered task done. Raises :class:`LeaseLost` if the lease is no longer
        ours: it expired, and the task is (or was) delivered again, perhaps finished by another
        consumer. An ack resent after a lost reply is recognised and succeeds.

        In a consumer loop (``take()`` or ``poll()``, then ``ack()``) the ack also fetches the
        next due tasks, up to ``prefetch``, in the same round trip: the next ``take()`` needs
        none. Tasks fetched ahead are handed out with at least half their lease left, and are
        handed back at once by ``close()``."""
        if await self._ack_one(task, fetch_ahead=True) is False:
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")

    async def _ack_one(self, task: AsyncTask, *, fetch_ahead: bool) -> bool:
        want = self._ahead.want(self._prefetch, self._policy.lease_ms) if fetch_ahead else 0
        if (
            want == 0
            or task.lease_token is None
            or task.queue is not self
            or self._ahead.tasks
            or (self._durability is not None and self._durability.after_ack)
            or (self._quiet_until() or 0.0) > backend.monotonic()  # nothing due to fetch yet
        ):
            return (await self.ack_many([task]))[0]
        tasks, result = await self._fetch(want, acks=[task])
        now = backend.monotonic()
        self._ahead.tasks.extend((t, now) for t in tasks)
        if result.acked[0]:
            object.__setattr__(task, "_settled", True)
        return result.acked[0]

    async def ack_many(self, tasks: Sequence[AsyncTask]) -> list[bool]:
        """Ack many tasks in one round trip; False where the lease was lost."""
        leased = [t for t in tasks if t.lease_token is not None]
        acked: list[bool] = []
        for keys, args, _ in self._ack_calls(leased):
            if self._durability is not None and self._durability.after_ack:
                (reply,) = await self._write(Op.ACK, [args], args[1::2], keys=keys)
            else:
                reply = await self._run(Op.ACK, args, keys=keys)
            acked += _acked(reply)
        return _settled(tasks, acked)

    def _ack_calls(
        self, leased: Sequence[AsyncTask]
    ) -> list[tuple[tuple[str, ...], list[Any], Sequence[AsyncTask]]]:
        """The ack script calls for ``leased``, in batches: keys, arguments, the batch."""
        calls = []
        for start in range(0, len(leased), protocol.MAX_BATCH):
            batch = leased[start : start + protocol.MAX_BATCH]
            args: list[Any] = [self._receipt_ms]
            for t in batch:
                args += (t.id, t.lease_token)
            receipt = self._keys.receipt("ack", protocol.new_nonce())
            calls.append(((*self._key_list, receipt), args, batch))
        return calls

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

    async def reject(self, task: AsyncTask, error: str) -> None:
        """Dead-letter a task now, with ``error`` as the reason."""
        await self._give_back(task, "dead", 0, error)

    async def _give_back(self, task: AsyncTask, outcome: str, delay_ms: int, error: str) -> None:
        if task.lease_token is None:
            return  # at-most-once: the task already left the queue
        args = protocol.nack_args(self._policy, task.id, task.lease_token, outcome, delay_ms, error)
        reply = await self._run(Op.NACK, args)
        if int(reply[0]) == 0:
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")
        object.__setattr__(task, "_settled", True)

    async def extend(self, task: AsyncTask, seconds: Duration) -> datetime:
        """Keep the lease for ``seconds`` from now; returns the new expiry. Raises
        :class:`LeaseLost` if the lease already expired or moved on."""
        if task.lease_token is None:
            raise LeaseLost("tasks taken at-most-once have no lease to extend")
        ms = duration_ms(seconds, "seconds", allow_zero=False)
        expiry = int(await self._run(Op.EXTEND, [task.id, task.lease_token, ms]))
        if expiry < 0:
            raise LeaseLost(f"lease on task {task.id} was lost; it is or will be delivered again")
        return to_datetime(expiry)  # type: ignore[return-value]

    # -- plumbing ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or (self._base is not None and self._base._closed):
            raise QueueClosed(f"queue {self.name!r} is closed")

    async def _run(
        self,
        op: Op,
        args: list[Any],
        *,
        deadline: float | None = -1.0,
        parse: bool = False,
        keys: Sequence[str] | None = None,
    ) -> Any:
        """Run a script through the connection layer (which retries lost connections and
        failovers until ``deadline``: -1 for the reconnect timeout, None for ever). Every
        script is safe to resend after a lost reply (see their headers: receipts or checks)."""
        self._check_open()
        try:
            reply = await self._runner.run(op, keys or self._key_list, args, deadline=deadline)
        except QueueClosed:
            self._check_open()
            raise
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self.name!r}: {exc}") from exc
        return protocol.parse_fetch(reply) if parse else reply

    # -- administration ---------------------------------------------------------------------

    async def tasks(
        self, state: TaskState | str, limit: int = 100, offset: int = 0
    ) -> list[TaskInfo]:
        """One page of the tasks in ``state``, in the order they leave it: ``ready`` and
        ``delayed`` by due time, ``inflight`` by lease expiry, ``dead`` oldest first (ties by
        priority). Each page is read in one step and costs O(log N + limit): no scans."""
        try:
            wanted = TaskState(state)
        except ValueError as exc:
            names = ", ".join(s.value for s in TaskState)
            raise ConfigError(f"state must be one of {names}, got {state!r}") from exc
        if (
            not isinstance(limit, int)
            or not isinstance(offset, int)
            or isinstance(limit, bool)
            or isinstance(offset, bool)
            or not 0 <= limit <= 10_000
            or offset < 0
        ):
            raise ConfigError(
                f"limit must be an int from 0 to 10000 and offset an int >= 0, "
                f"got {limit!r}, {offset!r}"
            )
        if limit == 0:
            return []
        reply = await self._run(Op.TASKS, [wanted.value, offset, limit])
        return [
            self._task_info(
                bytes(reply[i]).decode("utf-8", "surrogateescape"),  # as fetch reads ids
                wanted,
                int(float(reply[i + 1])) // 10,
                int(reply[i + 2]),
                bytes(reply[i + 3]),
                bytes(reply[i + 4]).decode(errors="replace") or None,
                int(float(reply[i + 5])) if reply[i + 5] else None,
            )
            for i in range(1, len(reply), 6)
        ]

    async def purge(self, states: Iterable[TaskState | str] | TaskState | str = ("dead",)) -> int:
        """Delete every task in ``states`` (default: the dead letters) and release their dedup
        keys; returns how many were deleted. Works in batches of 1000, so Redis is never busy
        for long however many there are. Purging ``inflight`` takes the leases away: those
        consumers' ack/nack/extend raise :class:`LeaseLost`."""
        if isinstance(states, str):
            states = (states,)
        try:
            wanted = sorted({TaskState(s).value for s in states})
        except (ValueError, TypeError) as exc:
            names = ", ".join(s.value for s in TaskState)
            raise ConfigError(f"states must be among {names}, got {states!r}") from exc
        if not wanted:
            raise ConfigError("purge needs at least one state")
        total, batch = 0, 1000
        while True:
            deleted = int((await self._run(Op.PURGE, [batch, *wanted]))[0])
            total += deleted
            if deleted < batch:
                return total
