"""The ``delayq`` command: operate queues from the shell and run workers.

Every command takes ``--redis`` (default: ``$REDIS_URL``, then ``redis://127.0.0.1:6379/0``)
and ``--prefix`` (default ``dq``). A password in ``--redis`` is visible to every user of the
machine (``ps``); ``REDIS_URL`` in the environment is not. Errors are one line on stderr and a
non-zero exit code: 2 for bad arguments, 1 for everything else (unknown queue or task, Redis
unreachable, ...). No message shows a password: URLs go through ``safe_url``.

Everything read from Redis reaches the terminal escaped (see render.py); ``--json`` is exact.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import sys
import time
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from .. import DelayQueue, TaskState
from .._core.keys import QueueKeys
from .._core.scripts import Op
from .._core.timing import duration_ms
from ..exceptions import ConfigError
from . import helptext, outboxdb, parse, render
from . import outbox as outbox_cli
from . import reshard as reshard_cli
from .common import (
    DATA_ROLES,
    DEFAULT_URL,
    TASK_ROLES,
    AllowMissingOpt,
    AtOpt,
    CliError,
    DelayOpt,
    JsonOpt,
    LimitOpt,
    PrefixOpt,
    QueueArg,
    RedisOpt,
    Session,
    State,
    bad,
    err,
    invoke,
    out,
    say,
    session,
    warn,
)

BATCH = 1000

app = typer.Typer(
    name="delayq",
    help="Operate delayq queues on Redis: schedule, inspect, fix and run workers.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


def version_of_delayq() -> str:
    try:
        return importlib.metadata.version("delayq")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        from .. import __version__

        return __version__


def show_version(value: bool) -> None:
    if value:
        say(f"delayq {version_of_delayq()}")
        raise typer.Exit()


@app.callback()
def overview(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Operate delayq queues on Redis: schedule, inspect, fix and run workers.

    --redis defaults to $REDIS_URL: prefer it when the URL holds a password (the command line
    shows in ps).
    """


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


# -- producing ------------------------------------------------------------------------------


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
    if json:
        render.print_json({"cancelled": [i for i, ok in done.items() if ok], "missed": missed})
    else:
        for task_id, ok in done.items():
            if ok:
                say(f"cancelled {task_id}")
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


# -- reading ---------------------------------------------------------------------------------


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
    outbox: outboxdb.StatsOutboxOpt = None,
) -> None:
    """Counts per state, overdue tasks and lifetime counters (a table, or --json).

    A table on a terminal; piped, plain aligned lines, one per queue, never cut. With
    --watch it refreshes every --interval seconds (--json: one line per refresh). A queue
    named that does not exist is an error (see --allow-missing).

    Example: delayq stats orders emails --watch --interval 2
    """
    overdue = parse.duration(overdue_after, "--overdue-after")
    with session(redis, prefix) as s:
        opened: dict[str, DelayQueue] = {}

        checked: set[str] = set()

        def read() -> list[Any]:
            names = list(queues or []) or s.registered()
            for n in names:
                if n not in opened:
                    opened[n] = s.queue(n, overdue_after=overdue)
            rows = [opened[n].stats() for n in names]
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

        def plain(rows: list[Any], *, titled: bool) -> None:
            if titled:
                say(title())
            for line in render.stats_lines(rows):
                say(line)

        if not watch:
            rows = read()
            if json:
                render.print_json([render.stats_json(r) for r in rows])
            elif not rows:
                warn(f"no queues under prefix {prefix!r}")
            elif out.is_terminal:
                out.print(show(rows))
            else:
                plain(rows, titled=False)
            outboxdb.stats_hook(outbox, json=json)
            return
        try:
            if json or not out.is_terminal:
                while True:
                    rows = read()
                    if json:
                        render.print_json([render.stats_json(r) for r in rows])
                    else:
                        plain(rows, titled=True)
                    time.sleep(interval)
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


@app.command("inspect")
def inspect_tasks(
    queue: QueueArg,
    state: Annotated[
        list[State] | None,
        typer.Option(
            "--state",
            "-s",
            metavar="STATE",
            help="Only this state: delayed, ready, inflight or dead (repeatable; default: all).",
        ),
    ] = None,
    limit: LimitOpt = 20,
    offset: Annotated[int, typer.Option(min=0, metavar="N", help="Skip this many per state.")] = 0,
    allow_missing: AllowMissingOpt = False,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """List tasks by state: ready (due), delayed (not yet due), inflight, dead; paged.

    Order: ready and delayed by due time, inflight by lease expiry, dead oldest first.

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
            out.print(render.tasks_table(page, title=f"{queue}: {st.value} ({len(page)} shown)"))
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


# -- fixing ----------------------------------------------------------------------------------


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

    A dead task whose dedup key another live task now holds stays dead.

    Example: delayq requeue orders --all
    """
    if bool(ids) == all:
        bad("give dead task ids or --all (not both)")
    with session(redis, prefix) as s:
        q = s.queue(queue)
        if all:
            moved = requeue_all(q)
            if not moved:
                s.require(queue)
            if json:
                render.print_json({"requeued": moved})
            else:
                say(f"requeued {moved} dead tasks of {queue}")
            return
        done = {task_id: q.requeue_dead(task_id) == 1 for task_id in ids or []}
        if not any(done.values()):
            s.require(queue)
    missed = [i for i, ok in done.items() if not ok]
    if json:
        render.print_json({"requeued": [i for i, ok in done.items() if ok], "missed": missed})
    else:
        for task_id, ok in done.items():
            if ok:
                say(f"requeued {task_id}")
    if missed:
        raise CliError(f"not requeued (not dead, or a live task holds its key): {' '.join(missed)}")


def requeue_all(q: DelayQueue) -> int:
    """``requeue_dead()`` in batches, with a progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    total = q.stats().dead
    moved, offset = 0, 0
    with Progress(
        TextColumn("requeue"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        bar = progress.add_task("requeue", total=total)
        while True:
            # The library's own loop (requeue_dead()), one batch at a time to show progress.
            reply = q._run(Op.REQUEUE, [BATCH, offset])
            done, examined = int(reply[0]), int(reply[1])
            moved += done
            offset += examined - done
            progress.update(bar, advance=examined, total=max(total, moved + offset))
            if examined < BATCH:
                return moved


@app.command()
def purge(
    queue: QueueArg,
    state: Annotated[
        list[State] | None,
        typer.Option(
            "--state",
            "-s",
            metavar="STATE",
            help="State to delete: delayed, ready, inflight or dead (repeatable; default: dead).",
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
                f"Delete {n} {'/'.join(states)} task(s) from {queue!r}?", default=False
            ):
                raise CliError("aborted: nothing deleted")
        deleted = q.purge(states)
        if not deleted:
            s.require(queue)
    if json:
        render.print_json({"purged": deleted, "states": states})
    else:
        say(f"purged {deleted} task(s) ({', '.join(states)}) from {queue}")


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
        for raw in sorted(set(s.registry_members())):
            name = raw.decode(errors="backslashreplace")
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


# -- running ---------------------------------------------------------------------------------


@app.command()
def demo(
    orders: Annotated[int, typer.Option(min=1, metavar="N", help="Orders to place.")] = 300,
    consumers: Annotated[int, typer.Option(min=1, metavar="N", help="Consumer threads.")] = 2,
    spread: Annotated[
        float, typer.Option(min=0.0, metavar="SECONDS", help="Seconds over which orders fall due.")
    ] = 5.0,
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis", envvar="REDIS_URL", help="Redis URL (default: a private redis-server)."
        ),
    ] = None,
) -> None:
    """The order-timeout demo: orders close at their deadline unless paid.

    Without --redis or REDIS_URL it starts a private redis-server for the run.

    Example: delayq demo --orders 1000 --spread 10
    """
    from .. import demo as demo_module

    argv = ["--orders", str(orders), "--consumers", str(consumers), "--spread", str(spread)]
    if redis:
        argv += ["--redis", redis]
    code = demo_module.main(argv)
    if code:
        raise typer.Exit(code)


@app.command()
def worker(
    target: Annotated[
        str,
        typer.Argument(metavar="TARGET", help="Handler as module:function.", show_default=False),
    ],
    queue: Annotated[
        list[str],
        typer.Option("--queue", "-q", metavar="QUEUE", help="Queue to consume (repeatable)."),
    ],
    concurrency: Annotated[
        int, typer.Option(min=1, metavar="N", help="Handlers running at once.")
    ] = 8,
    timeout: Annotated[
        str | None,
        typer.Option(metavar="DURATION", help="Abandon (and retry) a handler running this long."),
    ] = None,
    visibility_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="Lease of a delivered task (kept alive while it runs)."
        ),
    ] = "30s",
    max_attempts: Annotated[
        int, typer.Option(min=1, metavar="N", help="Deliveries before dead.")
    ] = 10,
    grace: Annotated[
        str, typer.Option(metavar="DURATION", help="On SIGTERM, wait this long for handlers.")
    ] = "30s",
    prefetch: Annotated[
        int | None,
        typer.Option(min=0, metavar="N", help="Tasks fetched ahead (default: the worker's)."),
    ] = None,
    health_file: Annotated[
        str | None, typer.Option(metavar="PATH", help="File touched while the loop is alive.")
    ] = None,
    codec: Annotated[str, typer.Option(metavar="CODEC", help="json, msgpack or pickle.")] = "json",
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, metavar="PORT", help="Serve Prometheus /metrics on this port."
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(metavar="HOST", help="Address for --metrics-port.")
    ] = "127.0.0.1",
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Run a handler on tasks as they fall due, until SIGTERM or Ctrl-C.

    An async def handler runs on an asyncio worker, a plain function on threads.
    Return = done; raise = retry with backoff, dead-lettered after --max-attempts.

    Example: delayq worker myapp.tasks:close_order --queue orders --concurrency 8
    """
    handler = parse.target(target)
    options: dict[str, Any] = {
        "timeout": parse.duration(timeout, "--timeout") if timeout is not None else None,
        "grace": parse.duration(grace, "--grace"),
        "health_file": health_file,
    }
    if prefetch is not None:
        options["prefetch"] = prefetch
    queue_options: dict[str, Any] = {
        "prefix": prefix,
        "codec": codec,
        "max_attempts": max_attempts,
        "visibility_timeout": parse.duration(visibility_timeout, "--visibility-timeout"),
    }
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        bad(f"--log-level: unknown level {log_level!r}")
    try:
        from .. import worker as runtime  # the worker runtime (imported only when needed)
    except ImportError as exc:
        raise CliError(f"the worker runtime is not available: {exc}") from exc
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    server = None
    if metrics_port is not None:
        from ..metrics import cli as metrics_cli

        options["metrics"], server = metrics_cli.worker_endpoint(
            redis, queue, metrics_port, metrics_host, prefix
        )
    options["handle_signals"] = True  # the command owns its process: SIGTERM/SIGINT stop it
    if runtime.is_coroutine_function(handler):
        from .. import AsyncDelayQueue

        async def run_async() -> None:
            qs = [AsyncDelayQueue(name, redis, **queue_options) for name in queue]
            try:
                await runtime.AsyncWorker(qs, handler, concurrency=concurrency, **options).run()
            finally:
                for q in qs:
                    await q.close()

        asyncio.run(run_async())
    else:
        qs = [DelayQueue(name, redis, **queue_options) for name in queue]
        try:
            runtime.Worker(qs, handler, concurrency=concurrency, **options).run()
        finally:
            for q in qs:
                q.close()
    if server is not None:
        server.stop()


@app.command()
def exporter(
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="Port of /metrics.")
    ] = 9808,
    host: Annotated[str, typer.Option(metavar="HOST", help="Address to bind.")] = "127.0.0.1",
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", "-q", metavar="QUEUE", help="Queue to report (repeatable; default: all)."
        ),
    ] = None,
    overdue_after: Annotated[
        str, typer.Option(metavar="DURATION", help="A due task waiting longer counts as overdue.")
    ] = "1s",
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Serve Prometheus metrics of the queues on /metrics, read from Redis at each scrape.

    Needs prometheus-client (delayq's metrics extra). Runs until SIGTERM or Ctrl-C.

    Example: delayq exporter --port 9808 --redis redis://cache:6379/0
    """
    from ..metrics import cli as metrics_cli

    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    seconds = parse.duration(overdue_after, "--overdue-after")
    # This command is the program: its log lines (a Redis outage, once) go to stderr.
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    metrics_cli.run_exporter(redis, port, host, prefix, queue, seconds, warn)


@app.command()
def dashboard(
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="Port to listen on.")
    ] = 8080,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to bind; beyond loopback needs a token.")
    ] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            envvar="DELAYQ_DASHBOARD_TOKEN",
            help="Require this token on every page (env DELAYQ_DASHBOARD_TOKEN).",
            show_envvar=False,
        ),
    ] = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Hide and refuse actions.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="A Host name clients use, besides loopback ones (repeatable; '*.example.com').",
        ),
    ] = None,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            metavar="IPS",
            help="Trust X-Forwarded-Proto/-For from these proxy addresses (comma separated).",
        ),
    ] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Serve the web dashboard: queues, an hour of charts, tasks and actions (docs/dashboard.md).

    Needs the extra of the same name (pip install delayq with dashboard). Runs until Ctrl-C.

    Example: DELAYQ_DASHBOARD_TOKEN=$(cat token) delayq dashboard --host 0.0.0.0
    --allowed-host queues.internal
    """
    try:
        from .. import dashboard as web
    except ImportError as exc:
        raise CliError(f"the dashboard needs: pip install 'delayq[dashboard]' ({exc})") from exc
    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    settings = web.Settings(
        redis, prefix, token=token or None, read_only=read_only,
        allowed_hosts=tuple(allowed_host or ()),
    )  # fmt: skip
    web.serve(settings, host, port, forwarded_allow_ips=forwarded_allow_ips)


# delayq relay and the delayq outbox group (cli/outbox.py), delayq reshard (cli/reshard.py).
for part in (outbox_cli.app, reshard_cli.app):
    app.registered_commands.extend(part.registered_commands)
    app.registered_groups.extend(part.registered_groups)

# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.getLogger("delayq").addHandler(logging.NullHandler())  # errors are ours to print
    command = helptext.quiet(typer.main.get_command(app))
    return invoke(command, args or ["--help"])
