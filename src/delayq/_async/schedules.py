"""``q.schedules``: recurring schedules stored in the queue's Redis (issue #19,
docs/schedules.md). Each fire is an ordinary task of the queue, offered by whichever consumer's
fetch finds it due; there is no scheduler process and no leader.

The sync ``Schedules`` in ``_sync/schedules.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Unpack

from .._core import protocol, sharding
from .._core.schedule import (
    LOOKAHEAD,
    LOOKAHEAD_LOW,
    Schedule,
    ScheduleInfo,
    SchedulePolicy,
    check_name,
)
from .._core.schedule_calls import (
    REQUEST_MS,
    TOMBSTONE_MS,
    FireOptions,
    backfill_times,
    check_fire_options,
    info_of,
    moved_to,
    parse_info,
    parse_refill,
    parse_upsert,
    refill_args,
    request_id,
    template,
    tz_mismatch,
    upsert_args,
)
from .._core.schedule_moves import far_source
from .._core.scripts import Op
from .._core.timing import Duration
from .._core.tzsource import TzSource, tz_source
from ..exceptions import ConfigError, ScheduleNotFound
from . import schedule_moves

if TYPE_CHECKING:
    from .queue import AsyncDelayQueue
    from .shard import AsyncShard

log = logging.getLogger("delayq")


class AsyncSchedules:
    """The recurring schedules of one queue (``queue.schedules``).

    A schedule lives on one shard of its queue (chosen by its name), under that shard's hash
    tag, so it works on a cluster and on sharded queues alike.
    """

    def __init__(self, queue: AsyncDelayQueue[Any]) -> None:
        self._queue = queue

    async def _shard(self, name: str, *, again: bool = False) -> AsyncShard:
        """The shard that holds schedule ``name`` in the current layout. During a reshard the
        schedule is carried there first if the mover has not got to it yet, so that it is
        never live on both sides (``again``: read the layout afresh, after a script said the
        schedule moved)."""
        routes = await self._queue._routes(again=again)
        home = routes.current[sharding.shard_of(check_name(name), len(routes.current))]
        if routes.previous:
            old = routes.previous_home(name)
            await schedule_moves.carry(self._queue._runner, old.keys, home.keys, name)
        return home

    async def _run_at_home(
        self, name: str, op: Op, args: list[Any], moved: Callable[[Any], bool]
    ) -> tuple[AsyncShard, Any]:
        """Run ``op`` on the shard of ``name``; again on the new one, after reading the layout
        afresh, while the reply says a reshard moved the schedule away (``moved``): the
        writer's layout was out of date. The shard and the reply."""
        for attempt in range(MOVED_TRIES):
            shard = await self._shard(name, again=attempt > 0)
            reply = await shard.run(op, args)
            if not moved(reply):
                return shard, reply
        raise ConfigError(
            f"schedule {name!r} of queue {self._queue.name!r} was moved by a reshard, and "
            f"the layout read {MOVED_TRIES} times does not say where: is a reshard running?"
        )

    async def upsert(
        self,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        tz: str = "UTC",
        phase: Duration = 0,
        start: datetime | None = None,
        end: datetime | None = None,
        max_fires: int | None = None,
        jitter: Duration | None = None,
        overlap: str = "skip",
        catchup: str = "latest",
        catchup_window: Duration | None = None,
        **options: Unpack[FireOptions],
    ) -> ScheduleInfo:
        """Create schedule ``name``, or change it if its spec differs; the same spec again is
        a no-op (so every process may upsert its schedules at start).

        ``cron`` (5 fields, or 6 with seconds first, in ``tz``) or ``every`` (seconds or a
        timedelta, aligned to ``phase`` after the Unix epoch) say when it fires, within
        ``start``/``end`` (aware datetimes) and at most ``max_fires`` times. Each fire is a
        task carrying ``payload`` (and the offer options ``priority``, ``headers``), due at its
        nominal time plus a ``jitter`` that is the same in every process and shorter than the
        gap to the next fire. ``overlap`` (``skip``, ``buffer_one``, ``buffer_all``,
        ``allow_all``) says what a fire does while an earlier one is still alive (offered and
        not yet acked, dead-lettered, cancelled or expired); ``catchup`` (``latest``, ``all``,
        ``skip``) what happens to the fires that fell due while no consumer ran, and
        ``catchup_window`` drops fires older than that, then and while they wait.

        A changed spec bumps the version, drops the fire not yet due and goes on from the
        later of now and the last fire: no time fires twice.
        """
        schedule = Schedule(cron=cron, every=every, tz=tz, phase=phase, start=start, end=end)
        policy = SchedulePolicy.of(
            max_fires=max_fires, jitter=jitter, overlap=overlap, catchup=catchup,
            catchup_window=catchup_window, priority=options.get("priority", 0),
        )  # fmt: skip
        headers, _ = check_fire_options(options)
        envelope = template(self._queue._codec, name, payload, headers, policy.priority)
        await self._queue._routes()  # the first look at a new queue records its layout
        await self._queue._register()
        args = upsert_args(name, schedule, policy, envelope)
        shard, reply = await self._run_at_home(name, Op.SCHEDULE_UPSERT, args, _refused)
        upserted = parse_upsert(reply)
        if schedule.cron is not None and upserted.ahead < LOOKAHEAD // 2:
            await self._write_times(shard, name, upserted.version, schedule, upserted.cursor_ms)
        info = await self.get(name)
        if info is None:  # removed by someone else in between
            raise ScheduleNotFound(f"schedule {name!r} was removed while it was upserted")
        return _with_changed(info, upserted.status != 0)

    async def _write_times(
        self, shard: AsyncShard, name: str, version: int, schedule: Schedule, after_ms: int
    ) -> None:
        args = refill_args(name, version, schedule, after_ms)
        refilled = parse_refill(await shard.run(Op.SCHEDULE_REFILL, args))
        if refilled.added > 0:
            mine = tz_source(schedule.tz)
            text = tz_mismatch(name, refilled.previous_tz, mine)
            said = (self._queue.keys.prefix, self._queue.name, name, refilled.previous_tz, mine)
            if text is not None and said not in _TZ_SAID:  # once per process
                _TZ_SAID.add(said)
                log.warning("delayq: queue %s: %s", self._queue.name, text)

    async def get(self, name: str, *, upcoming: int = 5) -> ScheduleInfo | None:
        """Schedule ``name`` as Redis holds it, with its next ``upcoming`` fire times; None if
        there is no such schedule."""
        args = [max(upcoming, 1), name]
        _, reply = await self._run_at_home(name, Op.SCHEDULE_INFO, args, _lists_moved)
        found = self._infos(reply, upcoming)
        return found[0] if found else None

    async def list(self, *, upcoming: int = 5) -> builtins.list[ScheduleInfo]:
        """Every schedule of the queue, by name (during a reshard, those still on the
        previous layout's shards too: the mover carries them within moments). The layout
        is read afresh: a listing cannot tell that a reshard moved schedules away."""
        routes = await self._queue._routes(again=True)
        found: dict[str, ScheduleInfo] = {}
        for shard in [*routes.previous, *routes.current]:  # the current layout's win
            reply = await shard.run(Op.SCHEDULE_INFO, [max(upcoming, 1)])
            found.update((info.name, info) for info in self._infos(reply, upcoming))
        return [found[name] for name in sorted(found)]

    def _infos(self, reply: Any, upcoming: int) -> builtins.list[ScheduleInfo]:
        now_ms, stored = parse_info(reply)
        codec = self._queue._codec
        return [info_of(s, codec, now_ms, upcoming) for s in stored if not moved_to(s)]

    async def pause(self, name: str, note: str | None = None) -> bool:
        """Stop firing ``name`` (its cursor stays); False if it was paused already."""
        return await self._control(name, "pause", note or "") == 1

    async def resume(self, name: str) -> bool:
        """Fire ``name`` again from now on: the fires that fell in the pause are skipped
        (:meth:`backfill` replays them). False if it was not paused."""
        return await self._control(name, "resume") == 1

    async def remove(self, name: str) -> bool:
        """Remove ``name``; fires already due stay queued. Its cursor and version are kept for
        a week as a tombstone, so a schedule created again with the name goes on after its
        last fire. False if there was no such schedule."""
        try:
            return await self._control(name, "remove", TOMBSTONE_MS) == 1
        except ScheduleNotFound:
            return False

    async def trigger(self, name: str, *, request: str | None = None) -> str | None:
        """One run of ``name`` now, obeying its overlap policy, leaving the chain alone: the
        fire's task id, or None if the overlap policy skipped it. The same ``request`` again
        (a retry) does nothing again."""
        rid = request_id(request) if request is not None else protocol.new_task_id()
        status, detail = await self._call(name, "trigger", rid, REQUEST_MS)
        return None if status == 0 else detail

    async def backfill(
        self, name: str, start: datetime, end: datetime, *, request: str | None = None
    ) -> int:
        """One fire, due now, for each of ``name``'s times in ``[start, end]`` (at most 100),
        whatever its overlap policy; how many were offered. The same ``request`` again (a
        retry) does nothing again."""
        info = await self.get(name, upcoming=0)
        if info is None:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self._queue.name!r}")
        times = backfill_times(info.schedule, start, end)
        rid = request_id(request) if request is not None else protocol.new_task_id()
        _, detail = await self._call(name, "backfill", rid, REQUEST_MS, *times)
        return int(detail)

    async def _control(self, name: str, action: str, *args: Any) -> int:
        status, _ = await self._call(name, action, *args)
        return status

    async def _call(self, name: str, action: str, *args: Any) -> tuple[int, str]:
        call = [name, action, *args]
        _, reply = await self._run_at_home(name, Op.SCHEDULE_CONTROL, call, _refused)
        status = int(reply[0])
        if status < 0:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self._queue.name!r}")
        return status, protocol._str(reply[1])

    async def refill(self, shard: AsyncShard, names: Sequence[str]) -> None:
        """Act on what a fetch said of some schedules: compute and write cron times for those
        that run short, and let those a reshard carried stop counting as running their fires
        that ended on the old side. Never raises: a fetch's consumer must not fail for it,
        and the next step asks again."""
        try:
            _, stored = parse_info(await shard.run(Op.SCHEDULE_INFO, [LOOKAHEAD, *names]))
            for found in stored:
                if moved_to(found):
                    continue
                far = far_source(found.state)
                if far is not None:
                    old = replace(shard.keys, name=far)
                    await schedule_moves.settle(self._queue._runner, shard.keys, old, found.name)
                info = info_of(found, self._queue._codec, 0, 0)
                if info.schedule.cron is not None and len(found.ahead) < LOOKAHEAD_LOW:
                    after = max([int(found.state["cursor"]), *found.ahead])
                    await self._write_times(shard, found.name, info.version, info.schedule, after)
        except Exception:  # logged, and asked again by the next step
            log.warning("delayq: could not add cron times to schedules %s", names, exc_info=True)


def _with_changed(info: ScheduleInfo, changed: bool) -> ScheduleInfo:
    return replace(info, changed=changed)


def _refused(reply: Any) -> bool:
    """Whether an upsert or control reply says a reshard moved the schedule away (-2)."""
    return int(reply[0]) == -2


def _lists_moved(reply: Any) -> bool:
    """Whether a schedule_info reply names a schedule a reshard moved away."""
    return any(moved_to(stored) for stored in parse_info(reply)[1])


# How many times a call follows a reshard's move (reading the layout again each time).
MOVED_TRIES: Final = 3
# What this process said about mixed tzdata releases: (prefix, queue, schedule, theirs, mine).
_TZ_SAID: set[tuple[str, str, str, TzSource | None, TzSource]] = set()
