"""The PostgreSQL outbox as the CLI reaches it: opening it (with a one-line error without the
postgres extra), database errors as :class:`CliError`, and its status as JSON or lines. Shared
by ``delayq outbox ...`` (outbox.py) and ``delayq stats --outbox`` (views.py), so that neither
command module imports the other."""

from __future__ import annotations

import json as jsonlib
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._core.text import printable
from .._core.timing import format_duration
from .common import CliError, from_source

if TYPE_CHECKING:
    from ..outbox import Outbox


def say_line(line: str) -> None:
    """One line on stdout as it is (the outbox commands write plain text, not through rich)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_outbox(dsn: str, table: str, schema: str | None) -> Outbox:
    if not dsn:
        raise CliError("give the database with --dsn or $DATABASE_URL", code=2)
    dsn = from_source(dsn, "--dsn")
    try:
        # Imported here: only the outbox commands load delayq.outbox, and without psycopg
        # (the postgres extra) only they fail, with the line below.
        from ..outbox import Outbox
        from ..outbox._conn import require_psycopg

        require_psycopg()
    except ImportError as exc:  # pragma: no cover - only without the extra
        raise CliError(f"the outbox needs: pip install 'delayq[postgres]' ({exc})") from exc
    return Outbox(dsn, table=table, schema=schema)


def _database_errors() -> tuple[type[BaseException], ...]:
    import psycopg  # there once open_outbox() has succeeded (the postgres extra)

    return (psycopg.Error,)


def run_db(fn: Any) -> Any:
    try:
        return fn()
    except _database_errors() as exc:
        raise CliError(f"PostgreSQL: {' '.join(str(exc).split())}") from exc


def require_installed(outbox: Outbox) -> None:
    if not run_db(outbox.installed):
        name = f"{outbox.schema}.{outbox.table}" if outbox.schema else outbox.table
        raise CliError(f"no outbox table {name!r} in that database: run delayq outbox install")


def status_json(st: Any) -> dict[str, Any]:
    return {
        "pending": st.pending,
        "dead": st.dead,
        "missed": st.missed,
        "oldest_pending_age_s": st.oldest_pending_age,
        "queues": [
            {
                "prefix": q.prefix,
                "queue": q.queue,
                "pending": q.pending,
                "dead": q.dead,
                "missed": q.missed,
                "oldest_pending_age_s": q.oldest_pending_age,
            }
            for q in st.queues
        ],
    }


def status_lines(st: Any) -> list[str]:
    """The outbox's status as plain lines (``delayq outbox status``)."""
    age = "-" if st.oldest_pending_age is None else format_duration(st.oldest_pending_age)
    missed = f", {st.missed} missed" if st.missed else ""
    lines = [f"outbox: {st.pending} pending, {st.dead} dead{missed}, oldest pending {age}"]
    for q in st.queues:
        q_age = "-" if q.oldest_pending_age is None else format_duration(q.oldest_pending_age)
        q_missed = f"  missed {q.missed}" if q.missed else ""
        # names come from the table: shown escaped, never as terminal control sequences
        lines.append(
            f"  {printable(q.prefix)}:{printable(q.queue)}  pending {q.pending}  "
            f"dead {q.dead}{q_missed}  oldest {q_age}"
        )
    return lines


def health_dsn_option(name: str, help: str) -> Any:
    """The option naming the outbox whose health a command adds: stats, exporter, dashboard."""
    return typer.Option(
        name, envvar="DELAYQ_OUTBOX_DSN", metavar="DSN", help=help, show_envvar=False
    )


StatsOutboxOpt = Annotated[
    str | None,
    health_dsn_option(
        "--outbox",
        "Also show the PostgreSQL outbox's backlog (table delayq_outbox); env DELAYQ_OUTBOX_DSN.",
    ),
]


def stats_hook(dsn: str | None, *, json: bool) -> None:
    """What ``delayq stats --outbox DSN`` adds after the queues: the outbox's status lines
    (with --json, one more JSON line: ``{"outbox": {...}}``)."""
    if not dsn:
        return
    st = run_db(open_outbox(dsn, "delayq_outbox", None).status)
    if json:
        say_line(jsonlib.dumps({"outbox": status_json(st)}))
    else:
        for line in status_lines(st):
            say_line(line)
