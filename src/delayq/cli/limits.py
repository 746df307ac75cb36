"""``delayq pause`` and ``resume``: flow control of a queue (issue #20)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from .._core.limits import PauseInfo
from .._core.timing import parse_duration
from . import parse, render
from .common import DEFAULT_URL, JsonOpt, PrefixOpt, QueueArg, RedisOpt, say, session

app = typer.Typer()  # its commands are top-level ones of `delayq` (see app.py)


def until_of(text: str) -> datetime | timedelta:
    """--until as a span from the server's now (``30m``) or an ISO time with a timezone."""
    try:
        return timedelta(seconds=parse_duration(text, "duration for --until"))
    except ValueError:
        return parse.timestamp(text, "--until")


def pause_json(info: PauseInfo) -> dict[str, Any]:
    return {"paused": info.paused, "until": info.until, "since": info.since, "note": info.note}


@app.command()
def pause(
    queue: QueueArg,
    until: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION|TIME",
            help="End the pause after this long (30m) or at this ISO time; default: resume.",
        ),
    ] = None,
    note: Annotated[str | None, typer.Option(metavar="TEXT", help="Why (shown by stats).")] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Hand out nothing from QUEUE until `delayq resume` (or --until); producers keep offering
    and leases in flight finish.

    Example: delayq pause orders --until 30m --note "provider maintenance"
    """
    end = None if until is None else until_of(until)
    with session(redis, prefix) as s:
        s.require(queue)
        info = s.queue(queue).pause(until=end, note=note)
    if json:
        render.print_json(pause_json(info))
    else:
        ends = "until resumed" if info.until is None else f"until {render.when(info.until)}"
        say(f"paused {queue} {ends}")


@app.command()
def resume(
    queue: QueueArg,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """End QUEUE's pause at once and wake its consumers.

    Example: delayq resume orders
    """
    with session(redis, prefix) as s:
        s.require(queue)
        was_paused = s.queue(queue).resume()
    if json:
        render.print_json({"resumed": was_paused})
    else:
        say(f"resumed {queue}" if was_paused else f"{queue} was not paused")
