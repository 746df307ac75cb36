"""``delayq queues``, ``stats``, ``get``, ``inspect`` and ``dead``: read what the queues hold,
never changing it."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from .. import TaskState
from . import parse, render
from .common import (
    DEFAULT_URL,
    AllowMissingOpt,
    CliError,
    JsonOpt,
    LimitOpt,
    PrefixOpt,
    QueueArg,
    RedisOpt,
    State,
    out,
    say,
    session,
    warn,
)
from .outboxdb import StatsOutboxOpt, stats_hook

app = typer.Typer()  # its commands are top-level ones of `delayq` (see app.py)


@app.command()
def queues(redis: RedisOpt = DEFAULT_URL, prefix: PrefixOpt = "dq", json: JsonOpt = False) -> None:
    """List the queues in the registry (every queue that was ever offered to).

    Example: delayq queues --redis redis://cache:6379/0
    """
    with session(redis, prefix) as s:
        names = s.registered()
    if json:
        render.print_json(names)
    elif not names:
        warn(f"no queues under prefix {prefix!r}")
    else:
        for name in names:
            say(name)


@app.command()
def stats(
    queues: Annotated[
        list[str] | None,
        typer.Argument(metavar="[QUEUE]...", help="Queues (default: all).", show_default=False),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        float,
        typer.Option(min=0.05, metavar="SECONDS", help="Seconds between refreshes (>= 0.05)."),
    ] = 1.0,
    overdue_after: Annotated[
        str,
        typer.Option(metavar="DURATION", help="A due task waiting longer than this is overdue."),
    ] = "1s",
    allow_missing: AllowMissingOpt = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
    outbox: StatsOutboxOpt = None,
) -> None:
    """Counts per state, overdue tasks and lifetime counters (a table, or --json).

    A table on a terminal; piped, plain aligned lines, one per queue, never cut. With
    --watch it refreshes every --interval seconds (--json: one line per refresh). A queue
    named that does not exist is an error (see --allow-missing).

    Example: delayq stats orders emails --watch --interval 2
    """
    overdue = parse.duration(overdue_after, "--overdue-after")
    with session(redis, prefix) as s:
        checked: set[str] = set()

        def read() -> list[Any]:
            names = list(queues or []) or s.registered()
            rows = s.conn.stats(names, overdue_after=overdue)  # one round per Redis node
            for row in rows:
                # An empty reply may be a misspelt name: checked once per named queue.
                if queues and row.queue not in checked and not (row.total or row.counters):
                    s.require(row.queue, allow_missing)
                checked.add(row.queue)
            return rows

        def title() -> str:
            return f"delayq stats ({prefix}) {time.strftime('%H:%M:%S')}"

        def show(rows: list[Any]) -> Any:
            return render.stats_table(rows, title(), out.width)

        def print_lines(rows: list[Any], *, titled: bool) -> None:
            """The rows as one JSON line (--json), else as a plain line per queue."""
            if json:
                render.print_json([render.stats_json(r) for r in rows])
                return
            if titled:
                say(title())
            for line in render.stats_lines(rows):
                say(line)

        if not watch:
            rows = read()
            if json or (rows and not out.is_terminal):
                print_lines(rows, titled=False)
            elif not rows:
                warn(f"no queues under prefix {prefix!r}")
            else:
                out.print(show(rows))
            stats_hook(outbox, json=json)
            return
        try:
            if json or not out.is_terminal:
                while True:
                    print_lines(read(), titled=True)
                    time.sleep(interval)
            # Only a live view on a terminal needs rich.live: the other commands skip it.
            from rich.live import Live

            with Live(show(read()), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(show(read()), refresh=True)
        except KeyboardInterrupt:
            return


@app.command()
def get(
    queue: QueueArg,
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.", show_default=False)],
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Show one task: state, times, attempts, payload, last error.

    Example: delayq get orders 0P7fugl200xqAzF~ --json
    """
    with session(redis, prefix) as s:
        info = s.queue(queue).get(task_id)
        if info is None:
            s.require(queue)
    if info is None:
        raise CliError(f"no task {task_id!r} in queue {queue!r}")
    if json:
        render.print_json(info)
    else:
        out.print(render.task_table(info))


@app.command("history")
def task_history(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.", show_default=False)],
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue", "-q", metavar="QUEUE", help="The task's queue (default: every queue)."
        ),
    ] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Show one task's history: a timeline of its offer, deliveries, retries, errors and end.

    Only a queue that keeps task histories has them (DelayQueue(..., history=...), see
    docs/history.md); a task's history lasts the queue's retention after the task ends.
    Without --queue every queue is searched. --json: a list of {queue, id, events}.

    Example: delayq history 0P7fugl200xqAzF~ --queue orders
    """
    with session(redis, prefix) as s:
        if queue is not None:
            s.require(queue)
        names = [queue] if queue is not None else s.registered()
        found = []
        for name in names:
            events = s.queue(name).history(task_id)
            if events:
                found.append((name, events))
        if not found:
            raise CliError(_no_history(s, task_id, names, queue))
    if json:
        render.print_json([{"queue": n, "id": task_id, "events": e} for n, e in found])
        return
    for name, events in found:
        out.print(render.history_table(events, f"task {task_id} in {name}: {len(events)} events"))


def _no_history(s: Any, task_id: str, names: list[str], queue: str | None) -> str:
    """Why no history of the task was found: which of the queues keep histories at all."""
    keeping = [n for n in names if s.queue(n).history_settings() is not None]
    where = f"queue {queue!r}" if queue is not None else "any queue"
    if not keeping:
        none = f"queue {queue!r} keeps no" if queue is not None else "no queue keeps"
        return (
            f"no history of task {task_id!r}: {none} task histories (turn them on with "
            "DelayQueue(..., history=timedelta(days=1)), see docs/history.md)"
        )
    kept = "" if queue is not None else f" (those keeping histories: {', '.join(keeping)})"
    return (
        f"no history of task {task_id!r} in {where}{kept}: no such task, or it ended longer "
        "ago than the retention"
    )


@app.command("inspect")
def inspect_tasks(
    queue: QueueArg,
    state: Annotated[
        list[State] | None,
        typer.Option(
            "--state",
            "-s",
            metavar="STATE",
            help="Only this state: delayed, ready, inflight, expired or dead (repeatable; "
            "default: all).",
        ),
    ] = None,
    limit: LimitOpt = 20,
    offset: Annotated[int, typer.Option(min=0, metavar="N", help="Skip this many per state.")] = 0,
    allow_missing: AllowMissingOpt = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """List tasks by state: ready (due), delayed (not yet due), inflight, expired, dead; paged.

    inflight: leased, the lease running; expired: the lease ran out and no consumer has
    reclaimed the task yet (a fetch does). Order: ready and delayed by due time, inflight
    and expired by lease expiry, dead oldest first.

    Example: delayq inspect orders --state ready --limit 50 --offset 100
    """
    states = [TaskState(s.value) for s in (state or list(State))]
    with session(redis, prefix) as s:
        q = s.queue(queue)
        pages = {st: q.tasks(st, limit=limit, offset=offset) for st in dict.fromkeys(states)}
        if not any(pages.values()):
            s.require(queue, allow_missing)
    if json:
        render.print_json([t for page in pages.values() for t in page])
        return
    for st, page in pages.items():
        if page or len(pages) == 1:
            title = f"{queue}: {st.value} ({len(page)} shown)"
            out.print(render.tasks_table(page, title, out.width))
    if not any(pages.values()):
        warn(f"no tasks in {', '.join(st.value for st in pages)}")


@app.command()
def dead(
    queue: QueueArg,
    limit: LimitOpt = 20,
    offset: Annotated[int, typer.Option(min=0, metavar="N", help="Skip this many.")] = 0,
    allow_missing: AllowMissingOpt = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """List dead-lettered tasks, oldest first, with the last line of their error.

    The full error (a traceback) is on: delayq get QUEUE ID (and in --json).

    Example: delayq dead orders --limit 100 --json
    """
    with session(redis, prefix) as s:
        rows = s.queue(queue).dead(limit=limit, offset=offset)
        if not rows:
            s.require(queue, allow_missing)
    if json:
        render.print_json(rows)
    elif rows:
        title = f"{queue}: dead ({len(rows)} shown)"
        out.print(render.dead_table(rows, title=title, width=out.width))
    else:
        warn(f"no dead tasks in {queue!r}")
