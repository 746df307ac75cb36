"""``delayq redisson migrate``: move a live Redisson ``RDelayedQueue`` into a delayq queue
(docs/migration/redisson.md)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import UTC, datetime
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._core.envelope import EnvelopeCodec
from .._core.redisson_moves import Backlog, Counts, Prepared
from .._core.text import printable
from ..redisson import Migration
from .common import DEFAULT_URL, PrefixOpt, RedisOpt

app = typer.Typer()  # its group is a top-level one of `delayq` (see app.py)
redisson_app = typer.Typer(
    name="redisson",
    help="The way off Redisson's RDelayedQueue: move its tasks into a delayq queue.",
    no_args_is_help=True,
)
app.add_typer(redisson_app, name="redisson")


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _backlog_lines(backlog: Backlog) -> list[str]:
    return [
        f"  delayed         {backlog.pending:,} (list: {backlog.listed:,}), "
        f"{backlog.due_now:,} due now",
        f"  ready           {backlog.ready:,} in the destination list (due, not yet taken)",
        f"  due             {_when(backlog.first_due_ms)} .. {_when(backlog.last_due_ms)}",
        f"  claims          {backlog.claimed:,} batches of an interrupted move (landed first)",
    ]


def _first_lines(first: list[Prepared], codec: EnvelopeCodec) -> list[str]:
    lines = []
    for item in first:
        if item.error:
            lines.append(f"  {item.task_id}  DEAD-LETTER  {printable(item.error)}")
            continue
        envelope = codec.decode(item.envelope)
        payload = json.dumps(envelope.payload, ensure_ascii=False)
        headers = f"  headers {dict(envelope.headers)}" if envelope.headers else ""
        kind = item.format.value if item.format else "ready"
        lines.append(f"  {item.task_id}  [{kind}]  {printable(payload)}{headers}")
    return lines


class _Stop:
    """SIGINT or SIGTERM asks the run to stop after the batch under way (a second SIGINT
    interrupts at once: a cross-slot batch claimed then lands on the next run)."""

    def __init__(self) -> None:
        self.asked = threading.Event()

    def __call__(self) -> bool:
        return self.asked.is_set()

    def __enter__(self) -> _Stop:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self.asked.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.asked.set()

        self._before = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)


@redisson_app.command("migrate")
def migrate(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="The Redisson destination queue's name."),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="QUEUE",
            help="The delayq queue. Named NAME, it shares Redisson's slot: atomic batches.",
        ),
    ],
    codec: Annotated[
        str,
        typer.Option("--codec", metavar="CODEC", help="Redisson's codec: string|json-jackson."),
    ] = "string",
    follow: Annotated[
        bool,
        typer.Option("--follow", help="Keep moving new Redisson offers until Ctrl-C."),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Count and show the first tasks decoded; change nothing."),
    ] = False,
    drop_class: Annotated[
        bool,
        typer.Option("--drop-class", help="Drop JSON's @class instead of keeping it as a header."),
    ] = False,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=1000, metavar="N", help="Members per batch.")
    ] = 100,
    show: Annotated[
        int, typer.Option("--show", min=0, max=100, metavar="N", help="Tasks --dry-run shows.")
    ] = 5,
    path: Annotated[
        str | None,
        typer.Option(
            "--path",
            metavar="PATH",
            help="atomic|claims: insist on a move path (default: atomic where the slot allows).",
        ),
    ] = None,
    queue_codec: Annotated[
        str, typer.Option("--queue-codec", metavar="CODEC", help="The delayq queue's codec.")
    ] = "json",
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Move the Redisson delayed queue NAME into the delayq queue QUEUE, due times kept.

    Every delayed member (both member formats) and every value already in the destination
    list (due now) becomes a delayq task, once; an undecodable one a dead letter with its raw
    bytes. Java producers may keep offering: --follow moves their offers as they come, woken
    by Redisson's own channel. Run --dry-run first.

    Example: delayq redisson migrate orders --to orders --codec json-jackson --dry-run
    """
    migration = Migration(
        name, to, redis, codec=codec, keep_class=not drop_class, prefix=prefix,
        queue_codec=queue_codec, batch=batch, path=path,
    )  # fmt: skip
    with migration:
        path = migration.path()
        out = sys.stdout
        if dry_run:
            backlog, counts, first = migration.preview(limit=show)
            formats = ", ".join(f"{k}: {v:,}" for k, v in sorted(counts.by_format.items()))
            lines = [
                f"dry run: Redisson RDelayedQueue {name!r} -> delayq queue {to!r} "
                "(nothing changed)",
                f"  move            {migration.describe(path)}",
                *_backlog_lines(backlog),
                f"  formats         {formats or 'none'}",
                f"  undecodable     {counts.dead_lettered:,} (would be dead-lettered)",
                f"first {len(first)} tasks as delayq would store them:",
                *_first_lines(first, EnvelopeCodec(queue_codec)),
            ]
            out.write("\n".join(lines) + "\n")
            return
        console = Console(stderr=True)
        with (
            _Stop() as stop,
            Progress(
                TextColumn("[bold]migrating[/] {task.fields[what]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress,
        ):
            backlog = migration.backlog()
            total = backlog.pending + backlog.ready
            what = f"{name} -> {to}" + (" (following: Ctrl-C to stop)" if follow else "")
            bar = progress.add_task("move", total=None if follow else total, what=what)

            def on_batch(counts: Counts) -> None:
                progress.update(bar, completed=counts.moved + counts.dead_lettered)

            summary = migration.run(follow=follow, stop=stop, on_batch=on_batch)
        out.write(summary.text() + "\n")
