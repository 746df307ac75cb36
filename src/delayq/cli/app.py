"""The ``delayq`` command: operate queues from the shell and run workers.

Every command takes ``--redis`` (default: ``$REDIS_URL``, then ``redis://127.0.0.1:6379/0``)
and ``--prefix`` (default ``dq``). Errors are one line on stderr and a non-zero exit code:
2 for bad arguments, 1 for everything else (unknown task, Redis unreachable, ...).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from redis.exceptions import RedisError
from rich.console import Console

from .. import DelayqError, DelayQueue, TaskState
from .._core.keys import QueueKeys
from .._core.scripts import Op
from .._core.urls import safe_url
from .._sync import backend
from ..exceptions import ConfigError
from . import parse, render

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CALL_TIMEOUT = 3.0  # seconds a command keeps retrying an unreachable Redis
BATCH = 1000

app = typer.Typer(
    name="delayq",
    help="Operate delayq queues on Redis: schedule, inspect, fix and run workers.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class CliError(Exception):
    """A failure to report as one line, with an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class State(StrEnum):
    delayed = "delayed"
    ready = "ready"
    inflight = "inflight"
    dead = "dead"


RedisOpt = Annotated[
    str,
    typer.Option(
        "--redis", envvar="REDIS_URL", help="Redis URL (env REDIS_URL).", show_envvar=False
    ),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="Key prefix of the queues.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON on stdout, for scripts.")]
QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.", show_default=False)]
DelayOpt = Annotated[
    str | None, typer.Option("--delay", "-d", help="Delay: 30s, 5m, 1h30m, 250ms or seconds.")
]
AtOpt = Annotated[str | None, typer.Option("--at", help="Due time, ISO 8601 with a timezone.")]


def bad(message: str) -> NoReturn:
    raise CliError(message, code=2)


class Session:
    """One Redis client shared by the queues a command touches."""

    def __init__(self, url: str, prefix: str) -> None:
        QueueKeys(prefix, "x")  # validates the prefix
        self.url, self.prefix = url, prefix
        try:
            self.client = backend.connect(url, "delayq-cli", CALL_TIMEOUT)[0]
        except ValueError as exc:
            bad(f"--redis: {exc}")
        self.queues: list[DelayQueue] = []

    def queue(self, name: str, **options: Any) -> DelayQueue:
        q = DelayQueue(
            name, self.client, prefix=self.prefix, reconnect_timeout=CALL_TIMEOUT, **options
        )
        self.queues.append(q)
        return q

    def registered(self) -> list[str]:
        """The queue names in the registry set ``<prefix>:queues``, sorted."""
        registry = QueueKeys(self.prefix, "x").registry
        try:
            raw = list(self.client.sscan_iter(registry, count=1000))
        except RedisError as exc:
            raise CliError(f"cannot read {registry} from {safe_url(self.url)}: {exc}") from exc
        names = sorted({v.decode(errors="replace") for v in raw})
        valid = []
        for name in names:
            try:
                QueueKeys(self.prefix, name)
                valid.append(name)
            except ConfigError:
                err.print(f"warning: skipping invalid queue name {name!r} in {registry}")
        return valid

    def close(self) -> None:
        for q in self.queues:
            q.close()
        self.client.close()


@contextmanager
def session(url: str, prefix: str) -> Iterator[Session]:
    s = Session(url, prefix)
    try:
        yield s
    finally:
        s.close()


def due_args(delay: str | None, at: str | None, *, required: bool = True) -> dict[str, Any]:
    if delay is not None and at is not None:
        bad("give --delay or --at, not both")
    if at is not None:
        return {"at": parse.timestamp(at)}
    if delay is not None:
        return {"delay": parse.duration(delay, "--delay")}
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
    key: Annotated[str | None, typer.Option(help="Dedup key: one live task per key.")] = None,
    id: Annotated[str | None, typer.Option("--id", help="Task id (repeat offers no-op).")] = None,
    priority: Annotated[int, typer.Option(min=0, max=9, help="0-9, 9 first.")] = 0,
    ttl: Annotated[
        str | None, typer.Option(help="Drop if not delivered this long after due.")
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Header name=value (repeatable).")
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
        out.print(task_id, markup=False)


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
    missed = [i for i, ok in done.items() if not ok]
    if json:
        render.print_json({"cancelled": [i for i, ok in done.items() if ok], "missed": missed})
    else:
        for task_id, ok in done.items():
            if ok:
                out.print(f"cancelled {task_id}", markup=False)
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
            raise CliError(
                f"task {task_id!r} in {queue!r} is not waiting (unknown, in flight or dead)"
            )
        info = q.get(task_id)
    due_at = info.due_at if info else None
    if json:
        render.print_json({"id": task_id, "due_at": due_at})
    else:
        out.print(f"{task_id} due {render.when(due_at)}", markup=False)


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
        err.print(f"no queues under prefix {prefix!r}", markup=False)
    else:
        for name in names:
            out.print(name, markup=False)


@app.command()
def stats(
    queues: Annotated[
        list[str] | None,
        typer.Argument(metavar="[QUEUE]...", help="Queues (default: all).", show_default=False),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between refreshes.")] = 1.0,
    overdue_after: Annotated[
        str, typer.Option(help="A due task waiting longer than this is overdue.")
    ] = "1s",
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Counts per state, overdue tasks and lifetime counters (a table, or --json).

    With --watch the table refreshes every --interval seconds (--json: one line per refresh).

    Example: delayq stats orders emails --watch --interval 2
    """
    overdue = parse.duration(overdue_after, "--overdue-after")
    with session(redis, prefix) as s:
        opened: dict[str, DelayQueue] = {}

        def read() -> list[Any]:
            names = list(queues or []) or s.registered()
            for n in names:
                if n not in opened:
                    opened[n] = s.queue(n, overdue_after=overdue)
            return [opened[n].stats() for n in names]

        def show(rows: list[Any]) -> Any:
            stamp = time.strftime("%H:%M:%S")
            return render.stats_table(rows, f"delayq stats ({prefix}) {stamp}", out.width)

        if not watch:
            rows = read()
            if json:
                render.print_json([render.stats_json(r) for r in rows])
            elif not rows:
                err.print(f"no queues under prefix {prefix!r}", markup=False)
            else:
                out.print(show(rows))
            return
        try:
            if json or not out.is_terminal:
                while True:
                    rows = read()
                    if json:
                        render.print_json([render.stats_json(r) for r in rows])
                    else:
                        out.print(show(rows))
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
        typer.Option("--state", "-s", help="Only this state (repeatable; default: all)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=0, max=10_000, help="Tasks per state.")] = 20,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many per state.")] = 0,
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
    if json:
        render.print_json([t for page in pages.values() for t in page])
        return
    for st, page in pages.items():
        if page or len(pages) == 1:
            out.print(render.tasks_table(page, title=f"{queue}: {st.value} ({len(page)} shown)"))
    if not any(pages.values()):
        err.print(f"no tasks in {', '.join(st.value for st in pages)}", markup=False)


@app.command()
def dead(
    queue: QueueArg,
    limit: Annotated[int, typer.Option(min=0, help="Most tasks to list.")] = 20,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many.")] = 0,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """List dead-lettered tasks, oldest first, with their last error.

    Example: delayq dead orders --limit 100 --json
    """
    with session(redis, prefix) as s:
        rows = s.queue(queue).dead(limit=limit, offset=offset)
    if json:
        render.print_json(rows)
    elif rows:
        out.print(render.dead_table(rows, title=f"{queue}: dead ({len(rows)} shown)"))
    else:
        err.print(f"no dead tasks in {queue!r}", markup=False)


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
            if json:
                render.print_json({"requeued": moved})
            else:
                out.print(f"requeued {moved} dead tasks of {queue}", markup=False)
            return
        done = {task_id: q.requeue_dead(task_id) == 1 for task_id in ids or []}
    missed = [i for i, ok in done.items() if not ok]
    if json:
        render.print_json({"requeued": [i for i, ok in done.items() if ok], "missed": missed})
    else:
        for task_id, ok in done.items():
            if ok:
                out.print(f"requeued {task_id}", markup=False)
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
        typer.Option("--state", "-s", help="State to delete (repeatable; default: dead)."),
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
            if not sys.stdin.isatty():
                bad("purge deletes tasks: pass --yes (no terminal to confirm on)")
            st = q.stats()
            n = sum(getattr(st, name) for name in states)
            if not typer.confirm(
                f"Delete {n} {'/'.join(states)} task(s) from {queue!r}?", default=False
            ):
                raise CliError("aborted: nothing deleted")
        deleted = q.purge(states)
    if json:
        render.print_json({"purged": deleted, "states": states})
    else:
        out.print(f"purged {deleted} task(s) ({', '.join(states)}) from {queue}", markup=False)


# -- running ---------------------------------------------------------------------------------


@app.command()
def demo(
    orders: Annotated[int, typer.Option(min=1, help="Orders to place.")] = 300,
    consumers: Annotated[int, typer.Option(min=1, help="Consumer threads.")] = 2,
    spread: Annotated[
        float, typer.Option(min=0.0, help="Seconds over which orders fall due.")
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
        list[str], typer.Option("--queue", "-q", help="Queue to consume (repeatable).")
    ],
    concurrency: Annotated[int, typer.Option(min=1, help="Handlers running at once.")] = 8,
    timeout: Annotated[
        str | None, typer.Option(help="Abandon (and retry) a handler running this long.")
    ] = None,
    visibility_timeout: Annotated[
        str, typer.Option(help="Lease of a delivered task (kept alive while it runs).")
    ] = "30s",
    max_attempts: Annotated[int, typer.Option(min=1, help="Deliveries before dead.")] = 10,
    grace: Annotated[str, typer.Option(help="On SIGTERM, wait this long for handlers.")] = "30s",
    prefetch: Annotated[
        int | None, typer.Option(min=0, help="Tasks fetched ahead (default: the worker's).")
    ] = None,
    health_file: Annotated[
        str | None, typer.Option(help="File touched while the loop is alive.")
    ] = None,
    codec: Annotated[str, typer.Option(help="json, msgpack or pickle.")] = "json",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Serve Prometheus /metrics on this port."),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address for --metrics-port.")] = "127.0.0.1",
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
    if inspect.iscoroutinefunction(handler):
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
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port of /metrics.")] = 9808,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Queue to report (repeatable; default: all)."),
    ] = None,
    overdue_after: Annotated[
        str, typer.Option(help="A due task waiting longer counts as overdue.")
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
    say = lambda line: err.print(line, markup=False, soft_wrap=True)  # noqa: E731
    metrics_cli.run_exporter(redis, port, host, prefix, queue, seconds, say)


@app.command()
def dashboard(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8080,
    host: Annotated[
        str, typer.Option(help="Address to bind; beyond loopback needs a token.")
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


from . import outbox as outbox_cli  # noqa: E402  (relay, outbox: cli/outbox.py)

outbox_cli.register(app)


# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.getLogger("delayq").addHandler(logging.NullHandler())  # errors are ours to print
    command = typer.main.get_command(app)
    try:
        code = command.main(args or ["--help"], prog_name="delayq", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except CliError as exc:
        return fail(str(exc), exc.code)
    except parse.BadValue as exc:
        return fail(str(exc), 2)
    except typer.TyperException as exc:  # usage errors from option parsing
        hint = ""
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            hint = f" (see: {ctx.command_path} --help)"
        return fail(exc.format_message() + hint, exc.exit_code)
    except typer.Abort:
        return fail("aborted", 1)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except DelayqError as exc:
        return fail(str(exc), 2 if isinstance(exc, ValueError) else 1)
    except RedisError as exc:
        return fail(f"Redis error: {exc}", 1)
    except OSError as exc:
        return fail(str(exc), 1)
    except Exception as exc:  # never a traceback, unless asked for
        if os.environ.get("DELAYQ_DEBUG"):
            raise
        return fail(f"unexpected {type(exc).__name__}: {exc} (DELAYQ_DEBUG=1 for details)", 1)


def fail(message: str, code: int) -> int:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    sys.stderr.flush()
    return code
