# Generated from _async/schedule_moves.py by scripts/unasync.py: do not edit.
"""Carrying a queue's schedules to the shards of its new layout (docs/schedules.md,
"Resharding"): at a reshard's start, again at its finish, and for one schedule whenever a
process that knows the new layout touches it before the mover got to it.

Each step is one script on one side (schedule_move.lua) and safe to run again, so a move
that was interrupted is finished by the next one. The sync functions in
``_sync/schedule_moves.py`` are generated from this file by ``scripts/unasync.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .._core.connection import Topology
from .._core.keys import QueueKeys
from .._core.schedule import LOOKAHEAD, spec_from_json
from .._core.schedule_calls import parse_info, refill_args
from .._core.schedule_moves import (
    far_source,
    home_of,
    land_args,
    parse_land,
    parse_names,
    parse_take,
    settle_args,
    take_args,
)
from .._core.scripts import Op
from . import runner

log = logging.getLogger("delayq")


def carry(conn: runner.Runner, old: QueueKeys, new: QueueKeys, name: str) -> bool:
    """Move schedule ``name`` (or its tombstone) from ``old`` to ``new``; False if ``old``
    had nothing of it (or both are the same sub-queue)."""
    if old.name == new.name:
        return False
    taken = parse_take(conn.run(Op.SCHEDULE_MOVE, old.all, take_args(name, new.name)))
    if taken is None:
        return False
    reply = conn.run(Op.SCHEDULE_MOVE, new.all, land_args(name, old.name, taken))
    landed = parse_land(reply)
    spec = taken.state.get(b"spec")
    if landed.status == 1 and spec is not None and landed.ahead < LOOKAHEAD // 2:
        schedule, _ = spec_from_json(spec.decode())
        if schedule.cron is not None:  # its times ahead ran short on the way
            after = int(taken.state.get(b"cursor", b"0"))
            if taken.times:
                after = max(after, int(taken.times[-1]))
            args = refill_args(name, landed.version, schedule, after)
            conn.run(Op.SCHEDULE_REFILL, new.all, args)
    return True


def carry_all(
    conn: runner.Runner, prefix: str, current: Sequence[str], previous: Sequence[str]
) -> int:
    """Carry every schedule (and removed schedule's tombstone) of the ``previous`` layout's
    (sub-)queues to its home in ``current``; how many moved. The old (sub-)queues are marked
    first, so that a process still routing there cannot create a schedule behind the
    mover's back (its upsert is refused, and it reads the layout again)."""
    sharded = conn.topology is Topology.CLUSTER
    keys = {sub: QueueKeys(prefix, sub, sharded_channel=sharded) for sub in [*current, *previous]}
    for sub in current:  # current again after an earlier reshard left it
        conn.run(Op.SCHEDULE_MOVE, keys[sub].all, ["away", "0"])
    moved = 0
    for sub in previous:
        # A sub-queue both layouts name (close shard counts can share one) stays current:
        # only its schedules whose home changed move (carry skips the others).
        if sub not in current:
            conn.run(Op.SCHEDULE_MOVE, keys[sub].all, ["away", "1"])
        names = parse_names(conn.run(Op.SCHEDULE_MOVE, keys[sub].all, ["names"]))
        for name in names:
            moved += carry(conn, keys[sub], keys[home_of(name, current)], name)
    if moved:
        log.info("delayq: carried %d schedule(s) to the new layout", moved)
    return moved


def settle(conn: runner.Runner, here: QueueKeys, far: QueueKeys, name: str) -> int:
    """Let schedule ``name`` (carried to ``here``) stop counting as running those of its fires
    on the old side ``far`` that ended; how many it still counts."""
    tombstone = conn.run(Op.SCHEDULE_MOVE, far.all, ["peek", name])
    reply = conn.run(Op.SCHEDULE_MOVE, here.all, settle_args(name, tombstone))
    return max(int(reply[0]), 0)


def settle_all(conn: runner.Runner, prefix: str, current: Sequence[str]) -> int:
    """:func:`settle` every schedule of the ``current`` layout that still counts fires of an
    old side as running; how many it still counts in all."""
    sharded = conn.topology is Topology.CLUSTER
    left = 0
    for sub in current:
        here = QueueKeys(prefix, sub, sharded_channel=sharded)
        _, stored = parse_info(conn.run(Op.SCHEDULE_INFO, here.all, [1]))
        for found in stored:
            far = far_source(found.state)
            if far is not None:
                far_keys = QueueKeys(prefix, far, sharded_channel=sharded)
                left += settle(conn, here, far_keys, found.name)
    return left
