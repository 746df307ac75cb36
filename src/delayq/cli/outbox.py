"""``delayq relay`` and ``delayq outbox install|status|dead|requeue``: the PostgreSQL outbox
from the shell (docs/outbox.md). Needs the postgres extra; the rest of the CLI does not."""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import CliError

if TYPE_CHECKING:
    from ..outbox import Outbox

DsnOpt = Annotated[
    str,
    typer.Option(
        "--dsn",
        envvar="DATABASE_URL",
        metavar="DSN",
        help="PostgreSQL connection string; default $DATABASE_URL.",
        show_envvar=False,
    ),
]
TableOpt = Annotated[str, typer.Option("--table", metavar="NAME", help="The outbox table.")]
SchemaOpt = Annotated[
    str | None, typer.Option("--schema", metavar="NAME", help="The table's schema.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON on stdout, for scripts.")]

outbox_app = typer.Typer(
    name="outbox",
    help="The PostgreSQL outbox: install its table, see what waits, fix dead rows.",
    no_args_is_help=True,
)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _outbox(dsn: str, table: str, schema: str | None) -> Outbox:
    if not dsn:
        raise CliError("give the database with --dsn or $DATABASE_URL", code=2)
    try:
        from ..outbox import Outbox
        from ..outbox._conn import require_psycopg

        require_psycopg()
    except ImportError as exc:  # pragma: no cover - only without the extra
        raise CliError(f"the outbox needs: pip install 'delayq[postgres]' ({exc})") from exc
    return Outbox(dsn, table=table, schema=schema)


def _database_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)


def _run_db(fn: Any) -> Any:
    try:
        return fn()
    except _database_errors() as exc:
        raise CliError(f"PostgreSQL: {' '.join(str(exc).split())}") from exc


def _require_installed(outbox: Outbox) -> None:
    if not _run_db(outbox.installed):
        name = f"{outbox.schema}.{outbox.table}" if outbox.schema else outbox.table
        raise CliError(f"no outbox table {name!r} in that database: run delayq outbox install")


@outbox_app.command("install")
def install(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
) -> None:
    """Create the outbox table, its indexes and its NOTIFY trigger (idempotent).

    Example: delayq outbox install --dsn postgresql://app@db/shop
    """
    outbox = _outbox(dsn, table, schema)
    _run_db(outbox.install)
    _say(f"outbox table {outbox.schema + '.' if outbox.schema else ''}{outbox.table} is installed")


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
    outbox = _outbox(dsn, table, schema)
    _require_installed(outbox)
    st = _run_db(outbox.status)
    if json:
        _say(jsonlib.dumps(_status_json(st)))
        return
    for line in status_lines(st):
        _say(line)


def _status_json(st: Any) -> dict[str, Any]:
    return {
        "pending": st.pending,
        "dead": st.dead,
        "oldest_pending_age_s": st.oldest_pending_age,
        "queues": [
            {
                "prefix": q.prefix,
                "queue": q.queue,
                "pending": q.pending,
                "dead": q.dead,
                "oldest_pending_age_s": q.oldest_pending_age,
            }
            for q in st.queues
        ],
    }


def status_lines(st: Any) -> list[str]:
    """The outbox's status as plain lines (``delayq outbox status``)."""
    age = "-" if st.oldest_pending_age is None else f"{st.oldest_pending_age:.3f}s"
    lines = [f"outbox: {st.pending} pending, {st.dead} dead, oldest pending {age}"]
    for q in st.queues:
        q_age = "-" if q.oldest_pending_age is None else f"{q.oldest_pending_age:.3f}s"
        lines.append(f"  {q.prefix}:{q.queue}  pending {q.pending}  dead {q.dead}  oldest {q_age}")
    return lines


@outbox_app.command("dead")
def dead(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="Most rows.")] = 100,
    json: JsonOpt = False,
) -> None:
    """Rows no relay could apply, with the error (oldest first).

    Example: delayq outbox dead --dsn postgresql://app@db/shop
    """
    from .._core.text import printable

    outbox = _outbox(dsn, table, schema)
    rows = _run_db(lambda: outbox.dead(limit))
    for row in rows:
        if json:
            _say(
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
            _say(
                f"{row.seq}  {printable(row.queue)}  {printable(row.task_id)}  {row.op}  "
                f"{row.created.isoformat()}  {printable(row.error or '')}"
            )
    if not rows and not json:
        _say("no dead rows")


@outbox_app.command("requeue")
def requeue(
    dsn: DsnOpt = "",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
) -> None:
    """Make every dead row pending again, for the relays to retry (after a fix).

    Example: delayq outbox requeue --dsn postgresql://app@db/shop
    """
    outbox = _outbox(dsn, table, schema)
    _say(f"{_run_db(outbox.requeue_dead)} dead rows are pending again")


def relay(
    dsn: DsnOpt = "",
    redis: Annotated[
        str,
        typer.Option(
            "--redis",
            envvar="REDIS_URL",
            metavar="URL",
            help="Redis URL; default $REDIS_URL.",
            show_envvar=False,
        ),
    ] = "redis://127.0.0.1:6379/0",
    table: TableOpt = "delayq_outbox",
    schema: SchemaOpt = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=5000, metavar="N", help="Rows per database transaction.")
    ] = 500,
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
        str, typer.Option(metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
) -> None:
    """Move committed outbox rows into their delayq queues, until SIGTERM or Ctrl-C.

    Woken by LISTEN/NOTIFY on each commit; any number of relays can run at once.

    Example: delayq relay --dsn postgresql://app@db/shop --redis redis://cache:6379/0
    """
    from .._core.urls import safe_url
    from ..outbox import AsyncRelay

    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise CliError(f"--log-level: unknown level {log_level!r}", code=2)
    outbox = _outbox(dsn, table, schema)  # validates the DSN and names before connecting
    _require_installed(outbox)
    relayer = AsyncRelay(
        dsn,
        redis,
        table=outbox.table,
        schema=outbox.schema,
        batch_size=batch_size,
        sweep_interval=sweep_interval,
        name=name,
    )
    if once:
        count = _run_db(lambda: asyncio.run(_relay_once(relayer)))
        _say(f"relayed {count} rows")
        return
    # This command is the program: its log lines (outages, dead rows) go to stderr.
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    server = None
    if metrics_port is not None:
        from ..outbox._metrics import serve_relay_metrics

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


def register(app: typer.Typer) -> None:
    """Add ``relay`` and the ``outbox`` group to the ``delayq`` command."""
    app.command("relay")(relay)
    app.add_typer(outbox_app, name="outbox")


StatsOutboxOpt = Annotated[
    str | None,
    typer.Option(
        "--outbox",
        envvar="DELAYQ_OUTBOX_DSN",
        metavar="DSN",
        help="Also show the PostgreSQL outbox's backlog (table delayq_outbox); env "
        "DELAYQ_OUTBOX_DSN.",
        show_envvar=False,
    ),
]


def stats_hook(dsn: str | None, *, json: bool) -> None:
    """What ``delayq stats --outbox DSN`` adds after the queues: the outbox's status lines
    (with --json, one more JSON line: ``{"outbox": {...}}``)."""
    if not dsn:
        return
    st = _run_db(_outbox(dsn, "delayq_outbox", None).status)
    if json:
        _say(jsonlib.dumps({"outbox": _status_json(st)}))
    else:
        for line in status_lines(st):
            _say(line)
