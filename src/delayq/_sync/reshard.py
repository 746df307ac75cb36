# Generated from _async/reshard.py by scripts/unasync.py: do not edit.
"""Resharding a live queue: record a new layout beside the old one, and end the move.

The sync functions in ``_sync/reshard.py`` are generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

from typing import Any

from .._core import protocol, sharding
from .._core.connection import Topology
from .._core.keys import QueueKeys
from .._core.scripts import Op
from ..exceptions import ConfigError
from . import runner
from .queue import announce_layout


def reshard(name: str, redis: Any = None, *, shards: int, prefix: str = "dq") -> str:
    """Start moving queue ``name`` (sharded or not) to ``shards`` sub-queues, live.

    Nothing is copied: Redis records the new layout with the old one beside it. Every queue
    object follows it (at once when it hears the announcement, within its safety interval
    otherwise): producers offer to the new layout only (a dedup key still live in the old
    layout stays there), consumers drain both, so the old sub-queues empty at their tasks'
    due times. When the old layout is empty, :func:`finish_reshard`. Returns the recorded
    layout (``"<new><<old>"``, 0 for an unsharded queue).
    """
    count = sharding.check_shards(shards)
    sharding.shard_names(name, count)  # validates the name for a sharded queue
    keys = QueueKeys(prefix, name)
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(conn.command("HGET", field, name), name)
        if layout is not None and layout.previous is not None:
            raise ConfigError(
                f"queue {name!r} is already being resharded ({layout.previous} -> "
                f"{layout.shards} shards): finish that first"
            )
        old = layout.shards if layout is not None else 0
        if old == count:
            raise ConfigError(f"queue {name!r} already has {count} shards")
        new = sharding.Layout(count, old)
        conn.command("HSET", field, name, new.encode())
        conn.command("SADD", keys.registry, name)
        _announce(conn, prefix, sharding.layout_names(name, layout)[0])
        return new.encode()
    finally:
        if not runner.shared(redis):  # a runner or a handle passed in stays open
            conn.close()


def finish_reshard(name: str, redis: Any = None, *, prefix: str = "dq") -> str:
    """End a reshard of ``name`` once its previous layout holds no task; returns the layout.
    Raises :class:`ConfigError` while any task is left there (say how many)."""
    conn = runner.connect(redis, "delayq-reshard", label=name)
    try:
        field = sharding.shards_key(prefix)
        layout = sharding.recorded_layout(conn.command("HGET", field, name), name)
        if layout is None or layout.previous is None:
            raise ConfigError(f"queue {name!r} is not being resharded")
        old = sharding.layout_names(name, layout)[1]
        calls = [(Op.STATS, QueueKeys(prefix, sub).all, [1000]) for sub in old]
        left = 0
        for reply in conn.many(calls):
            if isinstance(reply, Exception):
                raise reply
            left += protocol.parse_stats(reply).total
        if left:
            raise ConfigError(
                f"queue {name!r}: {left} task(s) still in the previous layout "
                f"({layout.previous} shards); they drain at their due times"
            )
        done = sharding.Layout(layout.shards)
        conn.command("HSET", field, name, done.encode())
        _announce(conn, prefix, old)
        return done.encode()
    finally:
        if not runner.shared(redis):  # a runner or a handle passed in stays open
            conn.close()


def _announce(conn: runner.Runner, prefix: str, names: list[str]) -> None:
    sharded = conn.topology is Topology.CLUSTER
    for sub in names:
        announce_layout(conn, QueueKeys(prefix, sub, sharded_channel=sharded))
