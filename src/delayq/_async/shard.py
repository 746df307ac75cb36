"""AsyncShard: the queue engine on one hash tag, so on one cluster slot.

A queue's tasks live in one or more shards: an unsharded queue is one shard under its own
name, a sharded one N under ``<name>~<i>.<salt>``, a queue being resharded both layouts'. A
shard owns its keys and its channel and runs its scripts through the shared connection layer;
the queue (``queue.py``) is the one face that routes calls to its shards. What a consumer
learned about a shard (its last empty look, the tasks an ack fetched ahead) is kept per face
in a :class:`Watch`, so that a ``with_policy`` view keeps its own.

The sync ``Shard`` in ``_sync/shard.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._core import history, protocol
from .._core.durability import Durability
from .._core.envelope import EnvelopeCodec
from .._core.history import HistoryEvent, HistorySettings
from .._core.keys import QueueKeys
from .._core.models import DedupMode, TaskInfo, TaskState, to_datetime
from .._core.offers import TaskId, task_ids_of
from .._core.protocol import FetchResult, OfferSpec, Policy, RawTask
from .._core.scripts import PLAIN, Op
from .._core.text import printable, utf8_safe
from ..exceptions import DecodeError, DelayqError, NotDurable, RedisUnavailable, ServerError
from . import backend, runner

log = logging.getLogger("delayq")


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """What every shard of one queue shares: the logical name (for messages), the codec,
    the durability asked for and how long a call's receipt lives."""

    name: str
    codec: EnvelopeCodec
    durability: Durability | None
    receipt_ms: int


class Quiet(NamedTuple):
    """What an empty look at a shard found: nothing due before ``wake_at`` (monotonic),
    unless its channel has news after ``mark``."""

    mark: int
    wake_at: float
    fetched_at: float
    result: FetchResult


@dataclass(eq=False)
class Ahead:
    """Tasks a consumer loop's ack fetched ahead for the next take(), with when they were
    leased (monotonic), and the loop's pace, which bounds how many are worth fetching."""

    tasks: deque[tuple[Any, float]] = field(default_factory=deque)
    consuming: bool = False  # take()/poll() handed a task out: acks may fetch ahead
    last_ack: float = 0.0
    pace: float | None = None  # seconds between acks (at-most-once: hand-outs), smoothed
    fetched: int = 1  # at-most-once: how many the last fetch asked for

    def want(self, fetch_ahead: int, lease_ms: int) -> int:
        """How many tasks the next ack should fetch ahead: as many as the loop hands out in
        LEASED_AHEAD_S and in a quarter of the lease (so each keeps at least half of it) at
        its pace, at least one and at most ``fetch_ahead``; none outside a take()/poll()
        loop. A slow loop's ack fetches just the next task: more would wait their turn in
        this loop while another consumer has nothing to do."""
        if not self.consuming or fetch_ahead == 0 or lease_ms == 0:
            return 0
        now = time.monotonic()
        if self.last_ack:
            gap = now - self.last_ack
            self.pace = gap if self.pace is None else 0.8 * self.pace + 0.2 * gap
        self.last_ack = now
        if self.pace is None:
            return 1
        window = min(LEASED_AHEAD_S, lease_ms / 4000)
        return max(1, min(fetch_ahead, int(window / max(self.pace, 1e-6))))

    def want_unleased(self, fetch_ahead: int) -> int:
        """How many tasks an at-most-once take()/poll() should fetch: as many as the loop
        hands out in UNLEASED_AHEAD_S at its pace, at least one and at most ``fetch_ahead``
        (each one fetched ahead is lost if the process dies before handing it out)."""
        now = time.monotonic()
        if self.last_ack:  # the tasks the last fetch brought were handed out since
            gap = (now - self.last_ack) / self.fetched
            self.pace = gap if self.pace is None else 0.8 * self.pace + 0.2 * gap
        self.last_ack = now
        want = 1
        if self.pace is not None and fetch_ahead > 0:
            want = max(1, min(fetch_ahead, int(UNLEASED_AHEAD_S / max(self.pace, 1e-6))))
        self.fetched = want
        return want


# At-most-once, a take() loop fetches ahead what it hands out in this long: enough to halve
# the round trips of a loop at a few thousand tasks/s, little to lose in a crash.
UNLEASED_AHEAD_S = 0.01
# With leases, what it hands out in this long: a fast loop pays one round trip per task, and
# no task waits leased in a loop for longer than this while another consumer is free.
LEASED_AHEAD_S = 0.05
# [H] Once offer_one.lua said the shard keeps task histories, plain offers go straight to
# offer.lua (which records them) for this long, then ask again (history may be off by then).
HISTORY_HINT_S = 60.0
# The plain fetch and ack (scripts.PLAIN) refuse a queue that uses a pause, limits, limit
# keys, histories or schedules, writing nothing; the shard then sends the full scripts for
# this long and tries the plain ones again: one refused call per period while they stay.
FULL_HOLD_S = 30.0


@dataclass(eq=False)
class Watch:
    """One face's knowledge of one shard: its last empty look and what was fetched ahead."""

    shard: AsyncShard
    quiet: Quiet | None = None
    ahead: Ahead = field(default_factory=Ahead)
    heard_unknown: bool = False  # news of unknown content came (a reconnect, a reshard)

    def quiet_until(self) -> float | None:
        """When the shard must next be looked at (monotonic), from its last empty look and
        the announcements since; None: look now."""
        quiet = self.quiet
        if quiet is None:
            return None
        notifier = self.shard.notifier
        if notifier.mark() != quiet.mark:
            mark, due_ms = notifier.news(quiet.mark)
            if due_ms is None:
                self.quiet = None
                self.heard_unknown = True
                return None
            wake_at = min(quiet.wake_at, quiet.fetched_at + quiet.result.seconds_until(due_ms))
            quiet = self.quiet = quiet._replace(mark=mark, wake_at=wake_at)
        return quiet.wake_at


class AsyncShard:
    """The keys, channel and script calls of one (sub-)queue."""

    def __init__(
        self, conn: runner.Runner, keys: QueueKeys, settings: ShardSettings, bell: backend.Bell
    ) -> None:
        self.keys = keys
        self._key_list = keys.all
        self._feature_keys = keys.features  # after a fetch's or an ack's receipt (_plain.lua)
        self._offer_one_keys = keys.offer_one
        self._mark = Durability.mark(keys.key("durable"))  # before a wait: see write()
        self._runner = conn
        self._settings = settings
        self.notifier = conn.subscriber.notifier(keys.channel, bell)
        self._recorded_until = 0.0  # [H] see HISTORY_HINT_S
        self._full_until = 0.0  # see FULL_HOLD_S

    @property
    def name(self) -> str:
        """The (sub-)queue's name: its hash tag."""
        return self.keys.name

    async def close(self) -> None:
        await self.notifier.close()

    # -- calls ------------------------------------------------------------------------------

    async def run(
        self,
        op: Op,
        args: list[Any],
        *,
        deadline: float | None = -1.0,
        keys: Sequence[str] | None = None,
    ) -> Any:
        """Run a script through the connection layer (which retries lost connections and
        failovers until ``deadline``: -1 for the reconnect timeout, None for ever). Every
        script is safe to resend after a lost reply (see their headers: receipts or checks).
        The fetch and the ack go plain first (see FULL_HOLD_S)."""
        keys = keys or self._key_list
        try:
            sent = self.variant(op)
            reply = await self._runner.run(sent, keys, args, deadline=deadline)
            if self.refused(sent, [reply]):
                reply = await self._runner.run(op, keys, args, deadline=deadline)
            return reply
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self._settings.name!r}: {exc}") from exc

    async def batch(
        self,
        op: Op,
        keys: Sequence[str],
        arg_lists: list[list[Any]],
        tail: Sequence[Any],
        deadline: float | None = -1.0,
    ) -> list[Any]:
        """The runner's batch of ``op``, plain first as :meth:`run`: a refused batch is sent
        again whole, full (what the plain calls did not refuse, a resend answers from its
        receipt). With a wait in ``tail``, a batch sent again marks first (see
        :meth:`Durability.mark`)."""
        again = (self._mark,) if tail else ()
        sent = self.variant(op)
        replies = await self._runner.batch(
            sent, keys, arg_lists, tail=tail, again=again, deadline=deadline
        )
        if self.refused(sent, replies[: len(arg_lists)]):
            replies = await self._runner.batch(
                op, keys, arg_lists, tail=tail, again=again, deadline=deadline
            )
        return replies

    def variant(self, op: Op) -> Op:
        """The script to send for ``op``: its plain variant if it has one and none was
        refused of late (see FULL_HOLD_S), else ``op``."""
        plain = PLAIN.get(op)
        return plain if plain is not None and self._full_until <= backend.monotonic() else op

    def refused(self, sent: Op, replies: Sequence[Any]) -> bool:
        """Whether ``sent``, a plain script, refused (replied nil) in ``replies``: the queue
        uses a feature, and the full scripts go for the next FULL_HOLD_S."""
        if sent not in PLAIN.values() or None not in replies:
            return False
        self._full_until = backend.monotonic() + FULL_HOLD_S
        return True

    async def write(
        self,
        op: Op,
        arg_lists: list[list[Any]],
        task_ids: Sequence[str],
        *,
        keys: Sequence[str] | None = None,
        what: str = "written",
        changed: Callable[[list[Any]], bool] | None = None,
        marked: bool = False,
    ) -> list[Any]:
        """Run a writing script once per argument list, in order, on one connection; with a
        :class:`Durability`, followed on that connection by its WAIT, and a shortfall raised
        as :class:`NotDurable` (or logged), unless ``changed(replies)`` says the scripts
        changed nothing (a reschedule that found no task). Resending is safe as in :meth:`run`.
        ``marked``: the scripts may find their work done by an earlier call on another
        connection and write nothing (an offer of an id or key that exists), so a mark goes
        before the wait (see :meth:`Durability.mark`); a call sent again always marks."""
        durability = self._settings.durability
        tail: tuple[Any, ...] = ()
        if durability is not None:
            tail = durability.commands()
            if marked:
                tail = (self._mark, *tail)
        try:
            replies = await self.batch(op, keys or self._key_list, arg_lists, tail)
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self._settings.name!r}: {exc}") from exc
        if durability is None:
            return replies
        scripts = replies[: len(arg_lists)]
        short = durability.shortfall(replies[len(arg_lists) :])
        if short is not None and (changed is None or changed(scripts)):
            message = (
                f"queue {self._settings.name!r}: {len(task_ids)} task(s) {what} but not "
                f"confirmed within {durability.timeout_s:g} s: {short}"
            )
            if durability.on_shortfall == "raise":
                raise NotDurable(message, [str(task_id) for task_id in task_ids])
            log.warning("delayq: %s", message)
        return scripts

    # -- producing --------------------------------------------------------------------------

    async def offer_plain(self, spec: OfferSpec) -> TaskId:
        """Offer a task with no options but its delay, whose id the queue drew: one short
        script (offer_one.lua), the producer's hot path; on a queue that keeps task
        histories, offer.lua (which records them)."""
        if self._recorded_until > backend.monotonic():
            return (await self.write_offers(DedupMode.KEEP, [spec], [True]))[0]
        for _ in range(protocol.ID_DRAWS):
            if self._settings.durability is None:
                status = await self.run(Op.OFFER_ONE, list(spec[:3]), keys=self._offer_one_keys)
            else:
                (status,) = await self.write(
                    Op.OFFER_ONE, [list(spec[:3])], [spec.id], keys=self._offer_one_keys
                )
            if status == protocol.HISTORY_ON:  # nothing written
                self._recorded_until = backend.monotonic() + HISTORY_HINT_S
                return (await self.write_offers(DedupMode.KEEP, [spec], [True]))[0]
            if status != protocol.ID_TAKEN:  # 0: an earlier attempt wrote it, reply lost
                return TaskId(spec.id)
            spec = spec._replace(id=protocol.new_task_id())
        raise protocol.no_free_id()

    async def write_offers(
        self,
        mode: protocol.OfferMode,
        specs: Sequence[OfferSpec],
        drawn: Sequence[bool],
        draws: int = 1,
    ) -> list[TaskId]:
        """Offer ``specs`` in order and say what each did. ``drawn[i]``: the queue drew
        ``specs[i].id``, so if another task holds it (two producers drew the same id) it draws
        a new one and offers that task again."""
        chunks = [
            specs[start : start + protocol.OFFER_CHUNK]
            for start in range(0, len(specs), protocol.OFFER_CHUNK)
        ]
        # In order, on one connection: a later task with the same key or id must lose.
        arg_lists = [protocol.offer_args(mode, chunk) for chunk in chunks]
        # An id or a key of the caller's may be found stored by an earlier call: see write().
        marked = not all(drawn) or any(spec.options for spec in specs)
        replies = await self.write(Op.OFFER, arg_lists, [spec.id for spec in specs], marked=marked)
        ids, statuses = task_ids_of(replies, specs, drawn)
        taken = []
        if protocol.ID_TAKEN in statuses:  # rare: skip the scan when nothing was taken
            taken = [i for i, st in enumerate(statuses) if st == protocol.ID_TAKEN and drawn[i]]
        if taken:
            if draws >= protocol.ID_DRAWS:
                raise protocol.no_free_id()
            fresh = protocol.new_task_ids(len(taken))
            again = [specs[i]._replace(id=new_id) for i, new_id in zip(taken, fresh, strict=True)]
            settled = await self.write_offers(mode, again, [True] * len(again), draws + 1)
            for i, task_id in zip(taken, settled, strict=True):
                ids[i] = task_id
        return ids

    async def holds_task(self, task_id: str) -> bool:
        """Whether this shard holds a task with ``task_id`` (in any state)."""
        return bool(await self._runner.command("HEXISTS", self.keys.key("tasks"), task_id))

    async def holds_key(self, key: str) -> bool:
        """Whether a live task of this shard holds dedup ``key``."""
        return bool(await self._runner.command("HEXISTS", self.keys.key("keys"), key))

    async def cancel(self, task_id: str) -> bool:
        """Cancel a waiting task; with a :class:`Durability`, the cancel waits for its copies as
        an offer does (a cancel only the old master had is undone by a failover, and the task
        runs). One that found no task waits too: its False then says the replicas have no
        waiting task either, so cancelling again after :class:`NotDurable` confirms the
        first cancel."""
        receipt = self.keys.receipt("cancel", protocol.new_nonce())
        (reply,) = await self.write(
            Op.CANCEL, [[self._settings.receipt_ms, task_id]], [task_id],
            keys=(*self._key_list, receipt), what="cancelled (or found not waiting)",
        )  # fmt: skip
        (cancelled,) = protocol.parse_cancel(reply)
        return cancelled

    async def reschedule(self, task_id: str, kind: str, value: Any) -> bool:
        """Move a waiting task's due time; waits for a :class:`Durability` as :meth:`cancel`."""
        receipt = self.keys.receipt("reschedule", protocol.new_nonce())
        (reply,) = await self.write(
            Op.RESCHEDULE, [[self._settings.receipt_ms, task_id, kind, value]], [task_id],
            keys=(*self._key_list, receipt), what="rescheduled",
            changed=lambda replies: protocol.parse_reschedule(replies[0]).moved,
        )  # fmt: skip
        return protocol.parse_reschedule(reply).moved

    # -- reading ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo | None:
        info = protocol.parse_info(await self.run(Op.INFO, [task_id]))
        if not info.state:  # [H] ended, perhaps: its history says how, while it lasts
            return history.ended_info(task_id, info.last_event) if info.last_event else None
        state = TaskState(info.state)
        if (
            state is TaskState.DELAYED
            and info.score_ms is not None
            and info.score_ms <= info.now_ms
        ):
            state = TaskState.READY
        return self.task_info(
            task_id, state, info.score_ms, info.attempts, info.envelope, info.error,
            info.expires_ms,
        )  # fmt: skip

    def task_info(
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
                decoded = self._settings.codec.decode(envelope)
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
            lease_expires_at=when if state in (TaskState.INFLIGHT, TaskState.EXPIRED) else None,
            dead_at=when if state is TaskState.DEAD else None,
            expires_at=to_datetime(expires_ms),
            last_error=error,
        )

    async def history(self, task_id: str) -> list[HistoryEvent]:
        """[H] The task's history, oldest event first ([] if it has none here)."""
        try:
            raw = await self._runner.command("LRANGE", self.keys.history(task_id), 0, -1)
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self._settings.name!r}: {exc}") from exc
        return history.parse_history(raw)

    async def history_settings(self, args: list[Any]) -> HistorySettings | None:
        """[H] Run the history script's get, set or off; the settings it had before."""
        return history.parse_settings(await self.run(Op.HISTORY, args))

    async def sweep_histories(self) -> None:
        """[H] After history was turned off: delete the histories of the tasks still here
        (no script records their end any more, so none would expire), a page at a time."""
        cursor: Any = "0"
        while True:
            cursor = await self.run(Op.HISTORY, ["sweep", cursor, 200])
            if cursor in (b"0", "0", 0):
                return

    def stats_call(self, overdue_ms: int) -> tuple[Op, tuple[str, ...], list[Any]]:
        """The stats script call, for the connection layer's ``many()``."""
        return (Op.STATS, self._key_list, [overdue_ms])

    async def dead(self, offset: int, limit: int) -> list[tuple[str, int, int, str | None, Any]]:
        """Dead letters, oldest first: (id, dead ms, attempts, error, payload or raw bytes)."""
        rows = protocol.parse_dead(await self.run(Op.DEAD, [offset, limit]))
        result = []
        for task_id, dead_ms, attempts, error, envelope in rows:
            try:
                payload = self._settings.codec.decode(envelope).payload if envelope else None
            except DecodeError:
                payload = envelope  # keep the raw bytes visible: that is why it is here
            result.append((task_id, dead_ms, attempts, error, payload))
        return result

    async def requeue_dead(self, task_id: str | None) -> int:
        if task_id is not None:
            return await self.requeue_ids([task_id])
        total, offset, batch = 0, 0, 1000
        while True:
            moved, examined = protocol.parse_requeue(await self.run(Op.REQUEUE, [batch, offset]))
            total += moved
            offset += examined - moved  # the ones left dead stay at the front
            if examined < batch:
                return total

    async def requeue_ids(self, ids: Sequence[str | bytes]) -> int:
        """Requeue the dead tasks ``ids`` (the others are left alone); how many moved."""
        if not ids:
            return 0
        return protocol.parse_requeue(await self.run(Op.REQUEUE, [len(ids), 0, *ids])).requeued

    async def dead_ids(self, offset: int, count: int) -> list[bytes]:
        """A page of the dead tasks' ids as Redis holds them, oldest first."""
        return list(
            await self._runner.command("ZRANGE", self.keys.key("dead"), offset, offset + count - 1)
        )

    async def dedup_keys(self, ids: Sequence[str | bytes]) -> list[str | None]:
        """The dedup key of each of tasks ``ids`` (None: it has none, or is not here)."""
        values = await self._runner.command("HMGET", self.keys.key("taskkeys"), *ids)
        return [None if v is None else v.decode().partition("|")[2] for v in values]

    async def key_taken(self, key: str, task_id: str | bytes) -> bool:
        """Whether a task other than ``task_id`` holds dedup ``key`` here: a live one, or one
        that finished within its ``key_ttl`` (as requeue.lua judges a holder)."""
        own = task_id.encode() if isinstance(task_id, str) else task_id
        holder = await self._runner.command("HGET", self.keys.key("keys"), key)
        if holder is None or holder == own:
            return False
        if await self._runner.command("HEXISTS", self.keys.key("tasks"), holder):
            return await self._runner.command("ZSCORE", self.keys.key("dead"), holder) is None
        kept = await self._runner.command("ZSCORE", self.keys.key("keptkeys"), key)
        if kept is None:
            return False
        seconds, micros = await self._runner.command("TIME")
        return float(kept) > int(seconds) * 1000 + int(micros) // 1000

    async def tasks(self, state: TaskState, offset: int, limit: int) -> list[TaskInfo]:
        rows = protocol.parse_tasks(await self.run(Op.TASKS, [state.value, offset, limit]))
        return [
            self.task_info(
                row.id,
                state,
                row.score_ms,
                row.attempts,
                row.envelope,
                row.error,
                row.expires_ms,
            )
            for row in rows
        ]

    async def purge(self, wanted: Sequence[str]) -> int:
        total, batch = 0, 1000
        while True:
            deleted = protocol.parse_purge(await self.run(Op.PURGE, [batch, *wanted]))
            total += deleted
            if deleted < batch:
                return total

    # -- consuming --------------------------------------------------------------------------

    async def fetch(
        self,
        watch: Watch,
        policy: Policy,
        count: int,
        deadline: float | None,
        safety_s: float,
        acks: Sequence[Any] = (),
    ) -> tuple[list[RawTask], FetchResult]:
        """One fetch script call: ack ``acks`` (tasks with ``id`` and ``lease_token``), then
        lease up to ``count`` due tasks, and record in ``watch`` when the next look is worth
        making."""
        mark = self.notifier.mark()
        args = protocol.fetch_args(policy, count, self._settings.receipt_ms)
        for task in acks:
            args += (task.id, task.lease_token)
        sent_at = backend.monotonic()
        keys = (*self._key_list, self.keys.receipt("fetch", args[2]), *self._feature_keys)
        durability = self._settings.durability
        if durability is not None and durability.after_fetch:
            result = await self._fetch_durably(durability, policy, args, keys, deadline)
        else:
            reply = await self.run(Op.FETCH, args, deadline=deadline, keys=keys)
            result = protocol.parse_fetch(reply, policy.lease_ms > 0)
        # The server read its clock about halfway through the round trip: plan from there.
        received_at = backend.monotonic()
        fetched_at = (sent_at + received_at) / 2 if received_at - sent_at < 0.05 else received_at
        # The reply says when something next falls due (a task, a lapse, a limit's gate):
        # not before then, unless the channel announces news. More due now: look at once.
        wake_at = fetched_at + safety_s
        if result.next_wake_ms is not None:
            wake_at = min(wake_at, fetched_at + result.seconds_until(result.next_wake_ms))
        watch.quiet = Quiet(mark, wake_at, fetched_at, result)
        return list(result.tasks), result

    async def _fetch_durably(
        self,
        durability: Durability,
        policy: Policy,
        args: list[Any],
        keys: Sequence[str],
        deadline: float | None,
    ) -> FetchResult:
        """The fetch script, then its WAIT on the same connection; a lease the replicas did
        not confirm is handed back before anyone runs it (see :class:`Durability`)."""
        try:
            reply, *waited = await self.batch(
                Op.FETCH, keys, [args], durability.commands(), deadline=deadline
            )
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self._settings.name!r}: {exc}") from exc
        result = protocol.parse_fetch(reply, policy.lease_ms > 0)
        short = durability.shortfall(waited)
        leased = [raw for raw in result.tasks if raw.token]
        if short is None or not leased:
            return result
        message = (
            f"queue {self._settings.name!r}: {len(leased)} lease(s) not confirmed within "
            f"{durability.timeout_s:g} s: {short}"
        )
        if durability.on_shortfall == "warn":
            log.warning("delayq: %s; handed out anyway", message)
            return result
        for raw in leased:  # unstarted: back to the queue, no attempt counted
            with contextlib.suppress(DelayqError):  # a lost one returns when its lease ends
                await self.give_back(policy, raw.id, raw.token or "", "release", 0, "")
        raise NotDurable(f"{message}; handed back", [raw.id for raw in leased])

    async def bury_undecodable(self, policy: Policy, raw: RawTask, exc: Exception) -> None:
        """Dead-letter a delivered task that cannot be read, addressed by its id's raw bytes
        (the id itself may be what cannot be read), its envelope kept as stored."""
        try:
            reason = str(exc)
        except Exception:  # an exception whose __str__ raises still has a type
            reason = ""
        reason = f"{type(exc).__name__}: {reason}" if not isinstance(exc, DecodeError) else reason
        log.error(
            "delayq: task %s in %s cannot be decoded, dead-lettered: %s",
            printable(raw.id_bytes), self._settings.name, printable(reason),
        )  # fmt: skip
        error = f"undecodable: {reason}"  # nack_args and the BURY line make it valid UTF-8
        if raw.token is None:
            await self.run(
                Op.BURY, [raw.id_bytes, raw.envelope, 9 - raw.priority, utf8_safe(error)]
            )
        else:
            await self.run(
                Op.NACK,
                protocol.nack_args(policy, raw.id_bytes, raw.token, "undecodable", 0, error),
            )

    def ack_calls(self, leased: Sequence[Any]) -> list[tuple[tuple[str, ...], list[Any]]]:
        """The ack script calls for ``leased`` (tasks with ``id`` and ``lease_token``), in
        batches of at most MAX_BATCH: keys and arguments."""
        calls = []
        for start in range(0, len(leased), protocol.MAX_BATCH):
            args: list[Any] = [self._settings.receipt_ms]
            for t in leased[start : start + protocol.MAX_BATCH]:
                args += (t.id, t.lease_token)
            receipt = self.keys.receipt("ack", protocol.new_nonce())
            calls.append(((*self._key_list, receipt, *self._feature_keys), args))
        return calls

    async def ack(self, leased: Sequence[Any]) -> list[bool]:
        """Ack ``leased`` in order; False where the lease was lost."""
        after_ack = self._settings.durability is not None and self._settings.durability.after_ack
        acked: list[bool] = []
        for keys, args in self.ack_calls(leased):
            if after_ack:
                (reply,) = await self.write(Op.ACK, [args], args[1::2], keys=keys)
            else:
                reply = await self.run(Op.ACK, args, keys=keys)
            acked += protocol.parse_ack(reply)
        return acked

    async def post_ack(self, task: Any) -> AckPosted:
        """Ack a leased task without waiting: the ack is written now (Redis runs it while the
        caller goes on) and its reply read by :meth:`AckPosted.acked`."""
        ((keys, args),) = self.ack_calls([task])
        return AckPosted(self, await self._runner.post(self.variant(Op.ACK), keys, args))

    async def give_back(
        self,
        policy: Policy,
        task_id: str,
        token: str,
        outcome: str,
        delay_ms: int,
        error: str,
        due_ms: int | None = None,
    ) -> bool:
        """Retry, release, throttle or dead-letter a leased task; False if the lease was
        lost."""
        args = protocol.nack_args(policy, task_id, token, outcome, delay_ms, error, due_ms)
        return protocol.parse_nack(await self.run(Op.NACK, args)).held

    async def extend(self, task_id: str, token: str, ms: int) -> int | None:
        """Keep a lease ``ms`` longer; the new expiry (epoch ms), None if it was lost."""
        return protocol.parse_extend(await self.run(Op.EXTEND, [task_id, token, ms]))


@dataclass(frozen=True, slots=True)
class AckPosted:
    """An ack written by :meth:`AsyncShard.post_ack`, its reply not read yet."""

    shard: AsyncShard
    posted: runner.Posted

    async def acked(self) -> bool:
        """Whether the task was acked (False: its lease was lost). A plain ack that refused
        (the queue uses a feature), or one that did not get through, runs again in full: the
        ack's receipt makes a resend answer as the first one did."""
        posted = self.posted
        try:
            reply = await self.shard._runner.outcome(posted)
            if self.shard.refused(posted.op, [reply]):
                reply = await self.shard._runner.run(Op.ACK, posted.keys, posted.args)
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"queue {self.shard._settings.name!r}: {exc}") from exc
        return protocol.parse_ack(reply)[0]
