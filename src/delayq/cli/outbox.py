"""``delayq relay`` and ``delayq outbox install|status|dead|requeue``: the PostgreSQL outbox
from the shell (docs/outbox.md). Needs the postgres extra; the rest of the CLI does not."""

from __future__ import annotations

import asyncio
import json as jsonlib
import signal
import sys
from typing import Annotated, Any

import typer

from .._core.text import printable
from .._core.urls import safe_url
from . import parse
from .common import DEFAULT_URL, CliError, JsonOpt, from_source, log_to_stderr
from .outboxdb import (
    open_outbox,
    require_installed,
    run_db,
    say_line,
    status_json,
    status_lines,
)

DsnOpt = Annotated[
    str,
    typer.Option(
        "--dsn",
        envvar="DATABASE_URL",
        metavar="DSN",
        help="PostgreSQL connection string, or env:NAME / file:PATH to read it from there "
        "(kept out of `ps`); default $DATABASE_URL.",
        show_envvar=False,
    ),
]
TableOpt = Annotated[str, typer.Option("--table", metavar="NAME", help="The outbox table.")]
SchemaOpt = Annotated[
    str | None, typer.Option("--schema", metavar="NAME", help="The table's schema.")
]

# What this module adds to `delayq`: the top-level `relay` and the `outbox` group (app.py).
app = typer.Typer()
outbox_app = typer.Typer(
    name="outbox",
    help="The PostgreSQL outbox: install its table, see what waits, fix dead rows.",
    no_args_is_help=True,
)


@outbox_app.command("install")
def install(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
) -> None:
    """Create the outbox table, its indexes and its NOTIFY trigger (idempotent).

    Example: delayq outbox install --dsn postgresql://app@db/shop
    """
    outbox = open_outbox(dsn, table, schema)
    run_db(outbox.install)
    say_line(
        f"outbox table {outbox.schema + '.' if outbox.schema else ''}{outbox.table} is installed"
    )


@outbox_app.command("status")
def status(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    json: JsonOpt = False,
) -> None:
    """Rows waiting for a relay and dead rows, per queue, with the oldest one's age (the lag).

    Example: delayq outbox status --dsn postgresql://app@db/shop
    """
    outbox = open_outbox(dsn, table, schema)
    require_installed(outbox)
    st = run_db(outbox.status)
    if json:
        say_line(jsonlib.dumps(status_json(st)))
        return
    for line in status_lines(st):
        say_line(line)


@outbox_app.command("dead")
def dead(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="Most rows.")] = 100,
    json: JsonOpt = False,
    missed: Annotated[
        bool,
        typer.Option("--missed", help="The cancels and reschedules that found no task instead."),
    ] = False,
) -> None:
    """Rows no relay could apply, with the error (oldest first).

    Example: delayq outbox dead --dsn postgresql://app@db/shop
    """
    outbox = open_outbox(dsn, table, schema)
    rows = run_db(lambda: outbox.dead(limit, missed=missed))
    for row in rows:
        if json:
            say_line(
                jsonlib.dumps(
                    {
                        "seq": row.seq,
                        "queue": row.queue,
                        "task_id": row.task_id,
                        "op": row.op,
                        "created": row.created.isoformat(),
                        "error": row.error,
                    }
                )
            )
        else:
            say_line(
                f"{row.seq}  {printable(row.queue)}  {printable(row.task_id)}  {row.op}  "
                f"{row.created.isoformat()}  {printable(row.error or '')}"
            )
    if not rows and not json:
        say_line(f"no {'missed' if missed else 'dead'} rows")


@outbox_app.command("requeue")
def requeue(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
) -> None:
    """Make every dead row pending again, for the relays to retry (after a fix).

    Example: delayq outbox requeue --dsn postgresql://app@db/shop
    """
    outbox = open_outbox(dsn, table, schema)
    say_line(f"{run_db(outbox.requeue_dead)} dead rows are pending again")


@outbox_app.command("purge-dead")
def purge_dead(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    missed: Annotated[
        bool,
        typer.Option(
            "--missed", help="Delete the cancels and reschedules that found no task instead."
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do it (without: only count).")] = False,
) -> None:
    """Delete the dead rows for good (after reading them with `delayq outbox dead`).

    Example: delayq outbox purge-dead --dsn postgresql://app@db/shop --yes
    """
    outbox = open_outbox(dsn, table, schema)
    require_installed(outbox)
    what = "missed" if missed else "dead"
    if not yes:
        st = run_db(outbox.status)
        say_line(f"{st.missed if missed else st.dead} {what} rows would go; add --yes to delete")
        return
    say_line(f"{run_db(lambda: outbox.purge_dead(missed=missed))} {what} rows deleted")


@app.command("relay")
def relay(
    dsn: DsnOpt = "",
    redis: Annotated[
        str,
        typer.Option(
            "--redis",
            envvar="REDIS_URL",
            metavar="URL",
            help="Redis URL, or env:NAME / file:PATH to read it from there; default $REDIS_URL.",
            show_envvar=False,
        ),
    ] = DEFAULT_URL,
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=5000, metavar="N", help="Rows per database transaction.")
    ] = 500,
    batch_bytes: Annotated[
        str,
        typer.Option(
            metavar="SIZE",
            help="At most this many bytes of tasks per transaction (4MiB, 512KiB or bytes); "
            "a single larger row goes alone.",
        ),
    ] = "4MiB",
    sweep_interval: Annotated[
        float,
        typer.Option(
            min=0.01, metavar="SECONDS", help="Look at the table this often without a NOTIFY."
        ),
    ] = 5.0,
    once: Annotated[
        bool, typer.Option("--once", help="Relay what is pending now, then exit.")
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, metavar="PORT", help="Serve Prometheus metrics on this port."
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(metavar="HOST", help="Address of the metrics endpoint.")
    ] = "127.0.0.1",
    name: Annotated[
        str, typer.Option(metavar="NAME", help="application_name of its database sessions.")
    ] = "delayq-relay",
    log_level: Annotated[
        str | None,
        typer.Option(
            metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR (default INFO; WARNING with --once)."
        ),
    ] = None,
    prefix: Annotated[
        list[str] | None,
        typer.Option(
            "--prefix", metavar="PREFIX", help="Serve only the rows of this key prefix (repeat)."
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", metavar="NAME", help="Serve only the rows of this queue (repeat)."),
    ] = None,
    wait_replicas: Annotated[
        int,
        typer.Option(
            min=0,
            max=100,
            metavar="N",
            help="Before deleting relayed rows, wait for N replicas to have the tasks "
            "(Redis WAIT); rows stay and are retried when fewer confirm.",
        ),
    ] = 0,
    wait_aof: Annotated[
        bool,
        typer.Option(
            "--wait-aof",
            help="Also wait for the append-only files to be fsynced (WAITAOF, Redis 7.2+).",
        ),
    ] = False,
    wait_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=60,
            metavar="SECONDS",
            help="How long to wait for --wait-replicas / --wait-aof.",
        ),
    ] = 1.0,
) -> None:
    """Move committed outbox rows into their delayq queues, until SIGTERM or Ctrl-C.

    Woken by LISTEN/NOTIFY on each commit; any number of relays can run at once.

    Example: delayq relay --dsn postgresql://app@db/shop --redis redis://cache:6379/0
    """
    from ..outbox import AsyncRelay  # loaded by the outbox commands alone (see open_outbox)
    from ..outbox._relay import LARGEST_BATCH_BYTES

    most_bytes = parse.size(batch_bytes, "--batch-bytes")
    if not 1 <= most_bytes <= LARGEST_BATCH_BYTES:
        raise CliError(f"--batch-bytes must be from 1 byte to 1GiB, got {batch_bytes!r}", code=2)

    if log_level is None:
        log_level = "WARNING" if once else "INFO"  # a one-shot run is quiet unless in trouble
    level = parse.log_level(log_level)
    outbox = open_outbox(dsn, table, schema)  # validates the DSN and names before connecting
    require_installed(outbox)
    redis = from_source(redis, "--redis")
    durability = None
    if wait_replicas or wait_aof:  # the queues' own outbox formats may still set theirs
        from .._core.durability import Durability

        durability = Durability(replicas=wait_replicas, aof=wait_aof, timeout=wait_timeout)
    relayer = AsyncRelay(
        from_source(dsn, "--dsn"),
        redis,
        table=outbox.table,
        schema=outbox.schema,
        batch_size=batch_size,
        batch_bytes=most_bytes,
        sweep_interval=sweep_interval,
        name=name,
        prefixes=prefix or (),
        only_queues=queue or (),
        durability=durability,
    )
    log_to_stderr(level)
    if once:
        count = run_db(lambda: asyncio.run(_relay_once(relayer)))
        say_line(f"relayed {count} rows")
        return
    server = None
    if metrics_port is not None:
        from ..outbox._metrics import serve_relay_metrics  # likewise

        server = serve_relay_metrics(outbox, relayer.stats, metrics_port, metrics_host)
        sys.stderr.write(f"delayq relay: metrics on {server.url}\n")
    sys.stderr.write(f"delayq relay: {outbox.table} -> {safe_url(redis)}\n")
    sys.stderr.flush()
    try:
        asyncio.run(_relay_until_signal(relayer))
    finally:
        if server is not None:
            server.stop()


async def _relay_once(relayer: Any) -> int:
    try:
        return int(await relayer.relay_pending())
    finally:
        await relayer.close()


async def _relay_until_signal(relayer: Any) -> None:
    # This command is the program, so it owns the signals (a library relay does not).
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relayer.stop)
    await relayer.run()


app.add_typer(outbox_app, name="outbox")
