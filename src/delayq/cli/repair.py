"""``delayq requeue``, ``purge`` and ``prune``: put dead tasks back, delete tasks, and drop
emptied queues from the registry."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .. import DelayQueue, TaskState
from .._core.keys import QueueKeys
from .._core.registry import member_text
from ..exceptions import ConfigError
from . import render
from .common import (
    DATA_ROLES,
    DEFAULT_URL,
    TASK_ROLES,
    CliError,
    JsonOpt,
    PrefixOpt,
    QueueArg,
    RedisOpt,
    State,
    bad,
    plural,
    say,
    say_done,
    session,
    warn,
)

BATCH = 1000  # dead tasks one step of `requeue --all` examines (one script call, one bar step)

app = typer.Typer()  # its commands are top-level ones of `delayq` (see app.py)


@app.command()
def requeue(
    queue: QueueArg,
    ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="[ID]...", help="Dead task ids.", show_default=False),
    ] = None,
    all: Annotated[bool, typer.Option("--all", help="Every dead task.")] = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Put dead tasks back, due now, with a fresh attempt count.

    A dead task whose dedup key another task now holds stays dead: a live one, or one
    that finished within its key_ttl.

    Example: delayq requeue orders --all
    """
    if ids and all:
        bad("give dead task ids or --all, not both")
    if not ids and not all:
        bad("give the dead task ids to requeue, or --all for every dead task")
    with session(redis, prefix) as s:
        q = s.queue(queue)
        if all:
            moved = requeue_all(q)
            if not moved:
                s.require(queue)
            if json:
                render.print_json({"requeued": moved})
            else:
                say(f"requeued {plural(moved, 'dead task')} of {queue}")
            return
        done = {task_id: q.requeue_dead(task_id) == 1 for task_id in ids or []}
        if not any(done.values()):
            s.require(queue)
        missed = {i: why_not_requeued(q, i) for i, ok in done.items() if not ok}
    say_done("requeued", done, [*missed], json=json)
    if missed:
        raise CliError("not requeued: " + "; ".join(f"{i}: {why}" for i, why in missed.items()))


def why_not_requeued(q: DelayQueue, task_id: str) -> str:
    """Why ``requeue_dead(task_id)`` moved nothing: no such task, a live one, or a dead task
    whose dedup key a live task holds now."""
    info = q.get(task_id)
    if info is None:
        return "no such task"
    if info.state is not TaskState.DEAD:
        return f"not dead (it is {info.state.value})"
    return f"a live task holds its dedup key {info.key!r}"


def requeue_all(q: DelayQueue) -> int:
    """``requeue_dead()`` of every dead task (in batches of 1000, shard by shard)."""
    return q.requeue_dead()


@app.command()
def purge(
    queue: QueueArg,
    state: Annotated[
        list[State] | None,
        typer.Option(
            "--state",
            "-s",
            metavar="STATE",
            help="State to delete: delayed, ready, inflight, expired or dead (repeatable; "
            "default: dead).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Delete every task in the given states (default: dead) and release their dedup keys.

    Asks for confirmation unless --yes; refuses without a terminal to ask on.

    Example: delayq purge orders --state dead --state delayed --yes
    """
    states = [s.value for s in dict.fromkeys(state or [State.dead])]
    with session(redis, prefix) as s:
        q = s.queue(queue)
        if not yes:
            s.require(queue)  # before asking: a misspelt name has nothing to confirm
            if not sys.stdin.isatty():
                bad("purge deletes tasks: pass --yes (no terminal to confirm on)")
            st = q.stats()
            n = sum(getattr(st, name) for name in states)
            if not typer.confirm(
                f"Delete {plural(n, '/'.join(states) + ' task')} from {queue!r}?", default=False
            ):
                raise CliError("aborted: nothing deleted")
        deleted = q.purge(states)
        if not deleted:
            s.require(queue)
    if json:
        render.print_json({"purged": deleted, "states": states})
    else:
        say(f"purged {plural(deleted, 'task')} ({', '.join(states)}) from {queue}")


@app.command()
def prune(
    empty: Annotated[
        bool, typer.Option("--empty", help="Also queues that hold no tasks (see above).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-n", help="List what would go; remove nothing.")
    ] = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Remove from the registry (PREFIX:queues) the queues that hold nothing.

    The registry lists every queue ever offered to; queues, stats, the exporter and the
    dashboard read it. Removed: names that are not valid queue names, and queues that hold
    no key at all (their keys were deleted). With --empty, also queues that hold no tasks
    (their lifetime counters stay). A producer registers a queue once, at its first offer:
    a queue pruned while such a producer runs stays out of the registry until that producer
    restarts, so use --empty for queues whose producers are gone. Nothing is deleted but
    registry entries; a queue that gains keys meanwhile is put back.

    Example: delayq prune --empty --dry-run
    """
    roles = TASK_ROLES if empty else DATA_ROLES
    removed: list[str] = []
    kept = 0
    with session(redis, prefix) as s:
        for raw in s.read_registry().members:
            name = member_text(raw)
            try:
                QueueKeys(prefix, name)
            except ConfigError:
                valid = False
            else:
                valid = True
                if s.holds_keys(name, roles):
                    kept += 1
                    continue
            removed.append(name)
            if dry_run:
                continue
            s.runner.command("SREM", s.registry, raw)
            # A queue offered to between the check and the removal goes back: the offer's
            # producer registered it before writing, and will not register it again.
            if valid and s.holds_keys(name, roles):
                s.runner.command("SADD", s.registry, raw)
                removed.pop()
                kept += 1
    if json:
        render.print_json({"removed": removed, "kept": kept, "dry_run": dry_run})
        return
    verb = "would remove" if dry_run else "removed"
    for name in removed:
        say(f"{verb} {name}")
    warn(f"{verb} {len(removed)} of {len(removed) + kept} registered queue(s) under {prefix!r}")
