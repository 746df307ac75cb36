"""``delayq demo``, ``worker``, ``exporter`` and ``dashboard``: the commands that run until
stopped. Each is the program, so it configures logging and owns the signals."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from .. import aconnect, connect
from .. import worker as runtime
from ..metrics import cli as metrics_cli
from . import parse
from .common import DEFAULT_URL, CliError, PrefixOpt, RedisOpt, Session, log_to_stderr, warn
from .outboxdb import health_dsn_option, open_outbox, require_installed, run_db

app = typer.Typer()  # its commands are top-level ones of `delayq` (see app.py)
WORKER_CLIENT = "delayq-worker"  # the CLIENT SETNAME of `delayq worker`'s connections


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
    # The demo's module (an embedded redis-server, its progress bars) loads only for a demo.
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
        int,
        typer.Option(
            min=1,
            metavar="N",
            help="Handlers running at once, split across the queues (at least one each).",
        ),
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
    create: Annotated[
        bool,
        typer.Option(
            "--create", help="The queues are new: register them, no unknown-queue warning."
        ),
    ] = False,
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
        "create": create,
    }
    log_to_stderr(parse.log_level(log_level))
    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    server = None
    if metrics_port is not None:
        options["metrics"], server = metrics_cli.worker_endpoint(
            redis, queue, metrics_port, metrics_host, prefix
        )
    options["handle_signals"] = True  # the command owns its process: SIGTERM/SIGINT stop it
    # One handle for every --queue: one pool and one pub/sub connection per Redis node,
    # whatever the number of queues and shards; closing it closes the queues.
    if runtime.is_coroutine_function(handler):

        async def run_async() -> None:
            async with aconnect(redis, prefix=prefix, client_name=WORKER_CLIENT) as conn:
                qs = [conn.queue(name, **queue_options) for name in queue]
                await runtime.AsyncWorker(qs, handler, concurrency=concurrency, **options).run()

        asyncio.run(run_async())
    else:
        with connect(redis, prefix=prefix, client_name=WORKER_CLIENT) as conn:
            qs = [conn.queue(name, **queue_options) for name in queue]
            runtime.Worker(qs, handler, concurrency=concurrency, **options).run()
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
    dsn: Annotated[
        str | None,
        health_dsn_option(
            "--dsn",
            "Also report this PostgreSQL outbox's health: pending, dead, oldest pending "
            "age, live relays (env DELAYQ_OUTBOX_DSN).",
        ),
    ] = None,
    table: Annotated[
        str, typer.Option(metavar="TABLE", help="The outbox table (with --dsn).")
    ] = "delayq_outbox",
    schema: Annotated[
        str | None, typer.Option(metavar="SCHEMA", help="The outbox table's schema.")
    ] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Serve Prometheus metrics of the queues on /metrics, read from Redis at each scrape.

    Needs prometheus-client (delayq's metrics extra); --dsn needs the postgres extra too.
    Runs until SIGTERM or Ctrl-C.

    Example: delayq exporter --port 9808 --redis redis://cache:6379/0 --dsn postgresql:///shop
    """
    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    outbox = None
    if dsn:
        box = open_outbox(dsn, table, schema)  # a bad DSN or name fails now, in one line
        run_db(lambda: require_installed(box))
        outbox = (dsn, table, schema)
    seconds = parse.duration(overdue_after, "--overdue-after")
    log_to_stderr()
    metrics_cli.run_exporter(redis, port, host, prefix, queue, seconds, warn, outbox)


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
    dsn: Annotated[
        str | None,
        health_dsn_option(
            "--dsn",
            "Also show this PostgreSQL outbox's health (table delayq_outbox; env "
            "DELAYQ_OUTBOX_DSN).",
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
        # The dashboard needs its extra (starlette, uvicorn): imported here, a missing extra
        # fails this command alone, with the line below.
        from .. import dashboard as web
    except ImportError as exc:
        raise CliError(f"the dashboard needs: pip install 'delayq[dashboard]' ({exc})") from exc
    Session(redis, prefix).close()  # validates --redis and --prefix before starting
    settings = web.Settings(
        redis, prefix, token=token or None, read_only=read_only,
        allowed_hosts=tuple(allowed_host or ()), outbox_dsn=dsn or None,
    )  # fmt: skip
    web.serve(settings, host, port, forwarded_allow_ips=forwarded_allow_ips)
