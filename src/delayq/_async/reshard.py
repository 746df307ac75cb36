"""Resharding a live queue: record a new layout beside the old one, and end the move.

The sync functions in ``_sync/reshard.py`` are generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._core import history, protocol, sharding
from .._core.connection import Topology
from .._core.keys import QueueKeys
from .._core.limits import THROTTLE_REASONS, WHOLE_QUEUE, Limit, parse_limit_rows
from .._core.scripts import Op
from .._core.timing import Duration, duration_ms
from ..exceptions import ConfigError
from . import runner, schedule_moves
from .queue import announce_layout

# How young a reshard finish_reshard refuses to end: past the default safety_interval (10 s)
# of every queue object opened before it, with room for a slow one.
DEFAULT_GRACE_S = 60.0
# The counters field that marks a (sub-)queue a finished reshard retired (offer.lua refuses
# new tasks there).
RETIRED = "retired"


async def reshard(name: str, redis: Any = None, *, shards: int, prefix: str = "dq") -> str:
    """Start moving queue ``name`` (sharded or not) to ``shards`` sub-queues, live.

    Tasks are not copied: Redis records the new layout with the old one beside it. Every
    queue object follows it (at once when it hears the announcement, within its safety
    interval otherwise): producers offer to the new layout only (a dedup key still live in
    the old layout stays there), consumers drain both, so the old sub-queues empty at their
    tasks' due times. Recurring schedules are carried to their shard in the new layout
    (docs/schedules.md), so their next fires go where consumers read; so are the queue's
    pause, its keys' limits and its history settings (a whole-queue limit, ``"*"``, refuses
    a reshard to more than one shard: docs/limits.md). When the old layout is
    empty, :func:`finish_reshard`. Returns the recorded layout (``"<new><<old>"``, 0 for an
    unsharded queue).

    The same call again while that reshard runs (after a timeout, say) finishes carrying
    the schedules and returns the same layout; another shard count is refused until the
    reshard is finished.
    """
    return (await start_reshard(name, redis, shards=shards, prefix=prefix)).layout


class Started(NamedTuple):
    """What :func:`start_reshard` did: the layout recorded, and how many schedules (and
    removed schedules' tombstones) it carried to the new layout."""

    layout: str
    schedules_moved: int


async def start_reshard(
    name: str, redis: Any = None, *, shards: int, prefix: str = "dq"
) -> Started:
    """:func:`reshard`, saying how many schedules it carried."""
    count = sharding.check_shards(shards)
    sharding.shard_names(name, count)  # validates the name for a sharded queue
    keys = QueueKeys(prefix, name)
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(await conn.command("HGET", field, name), name)
        if layout is not None and layout.previous is not None:
            if layout.shards != count:
                raise ConfigError(
                    f"queue {name!r} is already being resharded ({layout.previous} -> "
                    f"{layout.shards} shards): finish that first"
                )
            new = layout  # the same reshard asked again: carry what is left
        else:
            old = layout.shards if layout is not None else 0
            if old == count:
                raise ConfigError(f"queue {name!r} already has {count} shards")
            new = sharding.Layout(count, old)
            source = sharding.layout_names(name, layout)[0][0]
            # Before the layout is recorded: no consumer reads the new sub-queues before
            # they are paused and limited as the old ones are.
            await _carry_flow_control(conn, prefix, source, new, name)
            await conn.command("HSET", field, name, new.encode())
            # When it began, on Redis's clock: finish_reshard waits out the queues that have
            # not re-read the layout yet.
            began_ms = _server_ms(await conn.command("TIME"))
            await conn.command("HSET", reshards_key(prefix), name, began_ms)
            for sub in sharding.layout_names(name, new)[0]:  # retired by an earlier reshard?
                await conn.command("HDEL", QueueKeys(prefix, sub).key("counters"), RETIRED)
            await _carry_history(conn, prefix, source, new, name)
            await conn.command("SADD", keys.registry, name)
            await _announce(conn, prefix, sharding.layout_names(name, layout)[0])
        # After the announcement, so that consumers read the shards the next fires go to.
        current, previous = sharding.layout_names(name, new)
        moved = await schedule_moves.carry_all(conn, prefix, current, previous)
        return Started(new.encode(), moved)
    finally:
        if not runner.shared(redis):  # a runner or a handle passed in stays open
            await conn.close()


async def finish_reshard(
    name: str, redis: Any = None, *, prefix: str = "dq", grace: Duration = DEFAULT_GRACE_S
) -> str:
    """End a reshard of ``name`` once its previous layout holds no task; returns the layout.
    Raises :class:`ConfigError` while any task is left there (say how many), or while the
    reshard is younger than ``grace`` (seconds or a timedelta, default 60 s): a queue object
    opened before it writes to the previous layout until it re-reads the layout, within its
    ``safety_interval`` (10 s by default), and a task written there after the finish would
    reach no consumer."""
    try:
        grace_ms = duration_ms(grace, "grace")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(await conn.command("HGET", field, name), name)
        if layout is None or layout.previous is None:
            raise ConfigError(f"queue {name!r} is not being resharded")
        current, previous = sharding.layout_names(name, layout)
        # A move interrupted at the start (or a schedule a process created on the old
        # layout before it heard of the reshard) is carried now; its fires made there drain.
        await schedule_moves.carry_all(conn, prefix, current, previous)
        # Close shard counts can share a sub-queue (4 and 5 shards of "promo" both have
        # promo~0.3): it stays, and is neither waited for nor retired.
        old = [sub for sub in previous if sub not in current]
        await _refuse_if_left(conn, prefix, name, layout, old)
        began = await conn.command("HGET", reshards_key(prefix), name)
        if began is not None and grace_ms:
            age_ms = _server_ms(await conn.command("TIME")) - int(began)
            if age_ms < grace_ms:
                raise ConfigError(
                    f"queue {name!r}: the reshard began {age_ms / 1000:.1f} s ago; queues "
                    f"opened before it may still write to the previous layout until they "
                    f"re-read it (within their safety_interval): finish in "
                    f"{(grace_ms - age_ms) / 1000:.1f} s (grace {grace_ms / 1000:g} s)"
                )
        # Retire the old layout first, then look again: an offer that reached it between the
        # first look and now is counted, and none can reach it after (its scripts refuse new
        # tasks, LAYOUT_RETIRED, and the writer moves to the current layout).
        for sub in old:
            await conn.command("HSET", QueueKeys(prefix, sub).key("counters"), RETIRED, 1)
        try:
            await _refuse_if_left(conn, prefix, name, layout, old)
        except ConfigError:
            for sub in old:
                await conn.command("HDEL", QueueKeys(prefix, sub).key("counters"), RETIRED)
            raise
        await _carry_counters(conn, prefix, old, current)
        await _carry_kept_keys(conn, prefix, current, previous)
        done = sharding.Layout(layout.shards)
        await conn.command("HSET", field, name, done.encode())
        await _announce(conn, prefix, previous)
        # Every fire on the old layout has ended: the carried schedules stop counting any as
        # running there (consumers would see to it within a second or so anyway).
        await schedule_moves.settle_all(conn, prefix, current)
        return done.encode()
    finally:
        if not runner.shared(redis):  # a runner or a handle passed in stays open
            await conn.close()


async def _carry_counters(
    conn: runner.Runner, prefix: str, old: list[str], current: list[str]
) -> None:
    """Move the retired sub-queues' counts since the queue began into the current layout
    (stats and the exporter read only the current layout: its counts would drop): the
    queue's into its first sub-queue, each limit key's throttle counts into the key's shard.
    Count by count, added there then removed here: a finish cut short and run again counts
    at most the one it was moving twice, and none is lost."""
    into = QueueKeys(prefix, current[0]).key("counters")
    for sub in old:
        counters = QueueKeys(prefix, sub).key("counters")
        for field, value in (await conn.command("HGETALL", counters)).items():
            if protocol.lifetime_count(field.decode()):
                await conn.command("HINCRBY", into, field, int(value))
                await conn.command("HDEL", counters, field)
        for reason in THROTTLE_REASONS:  # [L] per limit key (stats' limit_throttled)
            role = f"lim:thr:{reason}"
            counts = QueueKeys(prefix, sub).key(role)
            for key, n in protocol.score_pairs(
                await conn.command("ZRANGE", counts, 0, -1, "WITHSCORES")
            ):
                home = current[sharding.shard_of(key.decode(), len(current))]
                await conn.command("ZINCRBY", QueueKeys(prefix, home).key(role), n, key)
                await conn.command("ZREM", counts, key)


async def _carry_kept_keys(
    conn: runner.Runner, prefix: str, current: list[str], previous: list[str]
) -> None:
    """Move the dedup keys that finished tasks keep taken (their ``key_ttl``) from the
    previous layout to their shard in the current one, the only place offers look once the
    reshard is finished. Each is written there before it is removed here: an offer made
    meanwhile finds it in one place or both. A key a task of the current layout holds by then
    is left to it."""
    now_ms = _server_ms(await conn.command("TIME"))
    for sub in previous:
        old, stayed = QueueKeys(prefix, sub), 0
        while page := await conn.command(
            "ZRANGEBYSCORE", old.key("keptkeys"), f"({now_ms}", "+inf", "WITHSCORES",
            "LIMIT", stayed, 500,
        ):  # fmt: skip
            for key, until in protocol.score_pairs(page):
                try:
                    home = current[sharding.shard_of(key.decode(), len(current))]
                except UnicodeDecodeError:  # not written by delayq: no offer can name it
                    home = sub
                if home == sub:  # a sub-queue both layouts share: its keys route here
                    stayed += 1
                    continue
                holder = await conn.command("HGET", old.key("keys"), key)
                new = QueueKeys(prefix, home)
                if holder is not None and (
                    await conn.command("HSETNX", new.key("keys"), key, holder)
                    or await conn.command("HGET", new.key("keys"), key) == holder
                ):
                    await conn.command("ZADD", new.key("keptkeys"), until, key)
                await conn.command("ZREM", old.key("keptkeys"), key)
                await conn.command("HDEL", old.key("keys"), key)


async def _refuse_if_left(
    conn: runner.Runner, prefix: str, name: str, layout: sharding.Layout, old: list[str]
) -> None:
    calls = [(Op.STATS, QueueKeys(prefix, sub).all, [1000]) for sub in old]
    left = 0
    for reply in await conn.many(calls):
        if isinstance(reply, Exception):
            raise reply
        left += protocol.parse_stats(reply).total
    if left:
        raise ConfigError(
            f"queue {name!r}: {left} task(s) still in the previous layout "
            f"({sharding.describe(sharding.Layout(layout.previous) if layout.previous else None)});"
            " they drain at their due times"
        )


async def _carry_flow_control(
    conn: runner.Runner, prefix: str, source: str, new: sharding.Layout, name: str
) -> None:
    """[L] The new layout's sub-queues get the old layout's pause (with its end, note and
    start) and every key's own limit, so a paused queue stays paused and a limited key stays
    limited for the tasks offered to the new layout. A whole-queue limit cannot go to more
    than one shard (see limits.py): refused before anything is written."""
    source_keys = QueueKeys(prefix, source).all
    own: list[tuple[str, Limit]] = [
        (row.key, row.limit)
        for row in parse_limit_rows(await conn.run(Op.LIMIT_ADMIN, source_keys, ["list"]))
        if row.limit is not None
    ]
    if new.shards > 1 and any(key == WHOLE_QUEUE for key, _ in own):
        raise ConfigError(
            f"queue {name!r} has a whole-queue limit ('*'), which a sharded queue cannot keep "
            f"exactly: remove it (delayq limits remove {name} '*', or q.limits.remove('*')) "
            "and limit the queue's keys instead, then reshard"
        )
    status, until_ms, since_ms, note = await conn.run(Op.LIMIT_PAUSE, source_keys, ["read"])
    for sub in sharding.layout_names(name, new)[0]:
        keys = QueueKeys(prefix, sub).all
        for key, limit in own:
            await conn.run(Op.LIMIT_ADMIN, keys, ["set", key, limit.encode()])
        if int(status) == 1:
            spec = f"a{int(until_ms)}" if int(until_ms) > 0 else ""
            # A timed pause that ended meanwhile is refused (status 2): nothing to carry.
            await conn.run(Op.LIMIT_PAUSE, keys, ["pause", spec, note, int(since_ms)])


async def _carry_history(
    conn: runner.Runner, prefix: str, source: str, new: sharding.Layout, name: str
) -> None:
    """[H] The new layout's sub-queues keep task histories as the old layout does."""
    reply = await conn.run(Op.HISTORY, QueueKeys(prefix, source).all, ["get"])
    settings = history.parse_settings(reply)
    if settings is None:
        return
    for sub in sharding.layout_names(name, new)[0]:
        await conn.run(Op.HISTORY, QueueKeys(prefix, sub).all, history.set_args(settings))


def reshards_key(prefix: str) -> str:
    """The hash of queue name -> when its reshard began (Redis ms; outside any queue's slot,
    like the layouts)."""
    return f"{prefix}:reshards"


def _server_ms(time_reply: Any) -> int:
    return int(time_reply[0]) * 1000 + int(time_reply[1]) // 1000


async def _announce(conn: runner.Runner, prefix: str, names: list[str]) -> None:
    sharded = conn.topology is Topology.CLUSTER
    for sub in names:
        await announce_layout(conn, QueueKeys(prefix, sub, sharded_channel=sharded))
