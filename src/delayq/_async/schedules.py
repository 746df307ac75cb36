"""``q.schedules``: recurring schedules stored in the queue's Redis (issue #19,
docs/schedules.md). Each fire is an ordinary task of the queue, offered by whichever consumer's
fetch finds it due; there is no scheduler process and no leader.

The sync ``Schedules`` in ``_sync/schedules.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Unpack

from .._core import protocol, sharding
from .._core.schedule import LOOKAHEAD, Schedule, ScheduleInfo, SchedulePolicy, check_name
from .._core.schedule_calls import (
    REQUEST_MS,
    TOMBSTONE_MS,
    FireOptions,
    backfill_times,
    check_fire_options,
    info_of,
    parse_info,
    parse_upsert,
    refill_args,
    request_id,
    template,
    upsert_args,
)
from .._core.scripts import Op
from .._core.timing import Duration
from ..exceptions import ScheduleNotFound

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

    async def _shard(self, name: str) -> AsyncShard:
        routes = await self._queue._routes()
        return routes.current[sharding.shard_of(check_name(name), len(routes.current))]

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
        shard = await self._shard(name)
        await self._queue._register()
        upserted = parse_upsert(
            await shard.run(Op.SCHEDULE_UPSERT, upsert_args(name, schedule, policy, envelope))
        )
        if schedule.cron is not None and upserted.ahead < LOOKAHEAD // 2:
            await self._write_times(shard, name, upserted.version, schedule, upserted.cursor_ms)
        info = await self.get(name)
        if info is None:  # removed by someone else in between
            raise ScheduleNotFound(f"schedule {name!r} was removed while it was upserted")
        return _with_changed(info, upserted.status != 0)

    async def _write_times(
        self, shard: AsyncShard, name: str, version: int, schedule: Schedule, after_ms: int
    ) -> None:
        await shard.run(Op.SCHEDULE_REFILL, refill_args(name, version, schedule, after_ms))

    async def get(self, name: str, *, upcoming: int = 5) -> ScheduleInfo | None:
        """Schedule ``name`` as Redis holds it, with its next ``upcoming`` fire times; None if
        there is no such schedule."""
        found = await self._read(await self._shard(name), [name], upcoming)
        return found[0] if found else None

    async def list(self, *, upcoming: int = 5) -> builtins.list[ScheduleInfo]:
        """Every schedule of the queue, by name."""
        routes = await self._queue._routes()
        found: builtins.list[ScheduleInfo] = []
        for shard in routes.current:
            found += await self._read(shard, [], upcoming)
        return sorted(found, key=lambda info: info.name)

    async def _read(
        self, shard: AsyncShard, names: Sequence[str], upcoming: int
    ) -> builtins.list[ScheduleInfo]:
        now_ms, stored = parse_info(await shard.run(Op.SCHEDULE_INFO, [max(upcoming, 1), *names]))
        return [info_of(s, self._queue._codec, now_ms, upcoming) for s in stored]

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
        shard = await self._shard(name)
        info = await self.get(name, upcoming=0)
        if info is None:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self._queue.name!r}")
        times = backfill_times(info.schedule, start, end)
        rid = request_id(request) if request is not None else protocol.new_task_id()
        reply = await shard.run(Op.SCHEDULE_CONTROL, [name, "backfill", rid, REQUEST_MS, *times])
        status, detail = int(reply[0]), protocol._str(reply[1])
        if status < 0:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self._queue.name!r}")
        return int(detail)

    async def _control(self, name: str, action: str, *args: Any) -> int:
        status, _ = await self._call(name, action, *args)
        return status

    async def _call(self, name: str, action: str, *args: Any) -> tuple[int, str]:
        shard = await self._shard(name)
        reply = await shard.run(Op.SCHEDULE_CONTROL, [name, action, *args])
        status = int(reply[0])
        if status < 0:
            raise ScheduleNotFound(f"no schedule {name!r} in queue {self._queue.name!r}")
        return status, protocol._str(reply[1])

    async def refill(self, shard: AsyncShard, names: Sequence[str]) -> None:
        """Compute and write cron times for the schedules a fetch said run short. Never
        raises: a fetch's consumer must not fail for it, and the next step asks again."""
        try:
            _, stored = parse_info(await shard.run(Op.SCHEDULE_INFO, [LOOKAHEAD, *names]))
            for found in stored:
                info = info_of(found, self._queue._codec, 0, 0)
                after = max([int(found.state["cursor"]), *found.ahead])
                await self._write_times(shard, found.name, info.version, info.schedule, after)
        except Exception:  # logged, and asked again by the next step
            log.warning("delayq: could not add cron times to schedules %s", names, exc_info=True)


def _with_changed(info: ScheduleInfo, changed: bool) -> ScheduleInfo:
    return replace(info, changed=changed)
