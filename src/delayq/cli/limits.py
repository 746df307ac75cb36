"""``delayq pause``, ``resume`` and ``limits list|set|remove``: flow control of a queue
(issue #20)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from .._core.limits import Limit, LimitInfo, PauseInfo
from .._core.text import printable
from .._core.timing import format_duration, parse_duration
from . import parse, render
from .common import (
    DEFAULT_URL,
    CliError,
    JsonOpt,
    PrefixOpt,
    QueueArg,
    RedisOpt,
    say,
    session,
)

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
        info = s.existing(queue).pause(until=end, note=note)
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
        was_paused = s.existing(queue).resume()
    if json:
        render.print_json({"resumed": was_paused})
    else:
        say(f"resumed {queue}" if was_paused else f"{queue} was not paused")


# -- delayq limits ----------------------------------------------------------------------------

limits_app = typer.Typer(
    help="Rate and concurrency limits per limit key ('*': the whole queue; '~default': keys "
    "without their own).",
    no_args_is_help=True,
)
KeyArg = Annotated[
    str,
    typer.Argument(metavar="KEY", help="A limit key, '*' or '~default'.", show_default=False),
]


def limit_row(info: LimitInfo) -> dict[str, Any]:
    limit = info.limit
    return {
        "key": info.key,
        "limit": None if limit is None else dataclasses.asdict(limit),
        "limit_of": info.limit_of,
        "running": info.running,
        "waiting": info.waiting,
        "next_admission_at": info.next_admission_at,
    }


def describe(limit: Limit | None) -> str:
    if limit is None:
        return "-"
    parts = []
    if limit.rate is not None:
        per = limit.per.total_seconds() if isinstance(limit.per, timedelta) else float(limit.per)
        parts.append(f"{limit.rate:g}/{'s' if per == 1 else format_duration(per)}")
        if limit.burst:
            parts.append(f"burst {limit.burst}")
    if limit.concurrency is not None:
        parts.append(f"concurrency {limit.concurrency}")
    if limit.weight != 1:
        parts.append(f"weight {limit.weight}")
    return ", ".join(parts)


@limits_app.command("list")
def list_limits(
    queue: QueueArg,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """The queue's limits, and every key with leases running or tasks waiting.

    Example: delayq limits list orders
    """
    with session(redis, prefix) as s:
        rows = s.existing(queue).limits.list()
    if json:
        render.print_json([limit_row(row) for row in rows])
        return
    if not rows:
        say(f"{queue} has no limits and no limited tasks")
        return
    table = [["key", "limit", "running", "waiting", "next admission"]]
    for row in rows:
        own = describe(row.limit)
        if row.limit is None and row.limit_of:
            own = f"({row.limit_of})"
        table.append(
            [
                printable(row.key),
                own,
                str(row.running),
                str(row.waiting),
                render.relative(row.next_admission_at) if row.next_admission_at else "-",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        say("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                      enumerate(zip(r, widths, strict=True))).rstrip())  # fmt: skip


@limits_app.command("set")
def set_limit(
    queue: QueueArg,
    key: KeyArg,
    rate: Annotated[
        float | None, typer.Option(metavar="N", help="Tasks that may start per --per.")
    ] = None,
    per: Annotated[
        str, typer.Option(metavar="DURATION", help="The rate's period (1s, 1m, ...).")
    ] = "1s",
    burst: Annotated[
        int | None, typer.Option(metavar="N", help="Starts at once after a quiet spell.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(metavar="N", help="Leases the key may hold at once.")
    ] = None,
    weight: Annotated[int, typer.Option(metavar="N", help="Share in fair scheduling.")] = 1,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Give KEY a limit (replacing its own); waiting tasks are judged again at once.

    Example: delayq limits set orders tenant:42 --rate 10 --per 1s --concurrency 2
    """
    limit = Limit(
        rate=rate,
        per=parse.duration(per, "--per"),
        burst=burst,
        concurrency=concurrency,
        weight=weight,
    )
    with session(redis, prefix) as s:
        q = s.existing(queue)
        q.limits.set(key, limit)
        info = q.limits.get(key)
    if json:
        render.print_json(limit_row(info))
    else:
        say(f"{queue} {key}: {describe(limit)}")


@limits_app.command("remove")
def remove_limit(
    queue: QueueArg,
    key: KeyArg,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Drop KEY's own limit (it falls back to '~default', if set).

    Example: delayq limits remove orders tenant:42
    """
    with session(redis, prefix) as s:
        removed = s.existing(queue).limits.remove(key)
    if json:
        render.print_json({"removed": removed})
    elif removed:
        say(f"{queue} {key}: limit removed")
    else:
        raise CliError(f"{queue!r} has no limit of its own for {key!r}")


app.add_typer(limits_app, name="limits")
