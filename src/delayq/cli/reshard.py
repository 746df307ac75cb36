"""``delayq reshard``: move a live queue to another shard count (docs/ha.md)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .._sync.reshard import finish_reshard, start_reshard
from .common import DEFAULT_URL, CliError, PrefixOpt, QueueArg, RedisOpt, session

app = typer.Typer()  # its command is a top-level one of `delayq` (see app.py)


@app.command(name="reshard")
def reshard_command(
    queue: QueueArg,
    shards: Annotated[
        int | None,
        typer.Option("--shards", min=1, max=1024, metavar="N", help="The new number of shards."),
    ] = None,
    finish: Annotated[
        bool,
        typer.Option("--finish", help="End a reshard whose previous layout is empty."),
    ] = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            max=86400,
            metavar="SECONDS",
            help="--finish refuses a reshard younger than this: queues opened before it "
            "re-read the layout within their safety interval.",
        ),
    ] = 60.0,
) -> None:
    """Move a live queue to N shards, or end such a move (--finish).

    Tasks are not copied: every queue object follows the new layout (at once, or within its
    safety interval): new tasks go to the new layout, consumers drain the old one at its
    tasks' due times. Recurring schedules are carried to their shard in the new layout.
    --finish once the old layout is empty. The same command again resumes a move that was
    cut short.
    """
    if (shards is None) == (not finish):
        raise CliError("give either --shards N or --finish", code=2)
    with session(redis, prefix) as s:
        s.require(queue)  # a misspelt name would be made a new sharded queue
        if finish:
            layout = finish_reshard(queue, s.conn, prefix=prefix, grace=grace)
            sys.stdout.write(f"{queue}: reshard finished, {layout} shards\n")
            return
        assert shards is not None
        started = start_reshard(queue, s.conn, shards=shards, prefix=prefix)
        new, _, old = started.layout.partition("<")
        was = "unsharded" if old == "0" else f"{old} shards"
        sys.stdout.write(
            f"{queue}: resharding from {was} to {new} shards; producers and consumers follow, "
            f"the old layout drains at its due times; then: delayq reshard {queue} --finish\n"
        )
        if started.schedules_moved:
            sys.stdout.write(
                f"{queue}: {started.schedules_moved} schedule(s) carried to the new layout\n"
            )
