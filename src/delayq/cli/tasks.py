"""``delayq offer``, ``cancel`` and ``reschedule``: schedule tasks and move or remove waiting
ones."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .._core.timing import duration_ms
from . import parse, render
from .common import (
    DEFAULT_URL,
    AtOpt,
    CliError,
    DelayOpt,
    JsonOpt,
    PrefixOpt,
    QueueArg,
    RedisOpt,
    bad,
    say,
    say_done,
    session,
)

app = typer.Typer()  # its commands are top-level ones of `delayq` (see app.py)


def due_args(delay: str | None, at: str | None, *, required: bool = True) -> dict[str, Any]:
    if delay is not None and at is not None:
        bad("give --delay or --at, not both")
    if at is not None:
        return {"at": parse.timestamp(at)}
    if delay is not None:
        seconds = parse.duration(delay, "--delay")
        duration_ms(seconds, "--delay")  # the queue's own bounds, checked before Redis is
        return {"delay": seconds}
    if required:
        bad("give --delay (e.g. 30s) or --at (e.g. 2030-01-31T09:30:00Z)")
    return {}


@app.command()
def offer(
    queue: QueueArg,
    payload: Annotated[
        str,
        typer.Argument(metavar="PAYLOAD_JSON", help="The payload, as JSON.", show_default=False),
    ],
    delay: DelayOpt = None,
    at: AtOpt = None,
    key: Annotated[
        str | None, typer.Option(metavar="KEY", help="Dedup key: one live task per key.")
    ] = None,
    id: Annotated[
        str | None, typer.Option("--id", metavar="ID", help="Task id (repeat offers no-op).")
    ] = None,
    priority: Annotated[
        int, typer.Option(min=0, max=9, metavar="0-9", help="Priority, 9 first.")
    ] = 0,
    ttl: Annotated[
        str | None,
        typer.Option(metavar="DURATION", help="Drop if not delivered this long after due."),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", metavar="NAME=VALUE", help="A header (repeatable)."),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="With --key: update the pending task instead.")
    ] = False,
    limit_key: Annotated[
        str | None,
        typer.Option(metavar="KEY", help="Run under this limit key's limits (delayq limits)."),
    ] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Schedule a task; prints its id (--json: also whether it was created, or an existing
    task with the key or id was kept or replaced).

    Example: delayq offer orders '{"order_id": 42}' --delay 30m --key close:42
    """
    data = parse.payload(payload)
    due = due_args(delay, at)
    options: dict[str, Any] = {
        "key": key,
        "id": id,
        "priority": priority,
        "headers": parse.headers(header),
        "ttl": parse.duration(ttl, "--ttl") if ttl is not None else None,
        "dedup": "replace" if replace else None,
        "limit_key": limit_key,
    }
    with session(redis, prefix) as s:
        task_id = s.queue(queue).offer(data, **due, **options)
    if json:
        # a dedup hit prints the id of the task holding the key; "outcome" says which it was
        render.print_json(
            {"id": task_id, "outcome": task_id.outcome.value, "created": task_id.created}
        )
    else:
        say(task_id)  # not out.print: an id like "x:smile:" is no emoji code


@app.command()
def cancel(
    queue: QueueArg,
    ids: Annotated[
        list[str], typer.Argument(metavar="ID...", help="Task ids.", show_default=False)
    ],
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Remove waiting (delayed or ready) tasks; fails for ids that are not waiting.

    Example: delayq cancel orders 0P7fugl200xqAzF~ 0P7fugl200xqAzG0
    """
    with session(redis, prefix) as s:
        q = s.queue(queue)
        done = {task_id: q.cancel(task_id) for task_id in ids}
        if not any(done.values()):
            s.require(queue)
    missed = [i for i, ok in done.items() if not ok]
    say_done("cancelled", done, missed, json=json)
    if missed:
        raise CliError(f"not cancelled (unknown, in flight or dead): {' '.join(missed)}", code=1)


@app.command()
def reschedule(
    queue: QueueArg,
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.", show_default=False)],
    delay: DelayOpt = None,
    at: AtOpt = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Move a waiting task's due time (from now with --delay, or to --at).

    Example: delayq reschedule orders 0P7fugl200xqAzF~ --delay 1h
    """
    due = due_args(delay, at)
    with session(redis, prefix) as s:
        q = s.queue(queue)
        if not q.reschedule(task_id, **due):
            s.require(queue)
            raise CliError(
                f"task {task_id!r} in {queue!r} is not waiting (unknown, in flight or dead)"
            )
        info = q.get(task_id)
    due_at = info.due_at if info else None
    if json:
        render.print_json({"id": task_id, "due_at": due_at})
    else:
        say(f"{task_id} due {render.when(due_at)}")
