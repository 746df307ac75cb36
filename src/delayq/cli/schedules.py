"""``delayq schedules ...``: see and steer a queue's recurring schedules (docs/schedules.md)."""

from __future__ import annotations

from datetime import UTC
from typing import Annotated, Any

import typer
from rich.table import Table

from .._core.schedule import ScheduleInfo
from ..exceptions import ScheduleNotFound
from . import parse, render
from .common import DEFAULT_URL, CliError, JsonOpt, PrefixOpt, QueueArg, RedisOpt, out, say, session

NameArg = Annotated[
    str, typer.Argument(metavar="SCHEDULE", help="Schedule name.", show_default=False)
]
RequestOpt = Annotated[
    str | None, typer.Option(metavar="ID", help="Request id: the same again is a no-op.")
]

# What this module adds to `delayq`: the `schedules` group (app.py).
app = typer.Typer()
schedules_app = typer.Typer(
    name="schedules",
    help="Recurring schedules: list, show, pause, resume, remove, trigger, backfill.",
    no_args_is_help=True,
)


def spec_text(info: ScheduleInfo) -> str:
    s = info.schedule
    return f"cron {s.cron} ({s.tz})" if s.cron is not None else f"every {s.every_ms / 1000:g}s"


def info_json(info: ScheduleInfo) -> dict[str, Any]:
    s = info.schedule
    return {
        "name": info.name,
        "cron": s.cron,
        "every_s": s.every_ms / 1000 if s.cron is None else None,
        "tz": s.tz,
        "explain": s.explain(),
        "payload": info.payload,
        "payload_error": info.payload_error,
        "version": info.version,
        "paused": info.paused,
        "note": info.note,
        "done": info.done,
        "overlap": info.overlap,
        "catchup": info.catchup,
        "next_fires": [t.isoformat() for t in info.next_fires],
        "last_fire": info.last_fire.isoformat() if info.last_fire else None,
        "last_success": info.last_success.isoformat() if info.last_success else None,
        "last_outcome": info.last_outcome,
        "fired": info.fired,
        "skipped": info.skipped,
        "missed": info.missed,
        "manual": info.manual,
        "backfilled": info.backfilled,
        "running": info.running,
        "tzdata": info.tzdata,
        "tzdata_source": info.tzdata_source,
    }


def payload_text(info: ScheduleInfo) -> str:
    """The payload as the CLI's queue reads it (JSON codec: msgpack envelopes decode too; a
    pickled one, or one that cannot be read at all, shows as invalid)."""
    if info.payload_error is not None:
        return f"invalid: {info.payload_error}"
    return render.preview(info.payload)


def tzdata_text(info: ScheduleInfo) -> str:
    if info.schedule.cron is None:
        return "- (interval times need no time zone)"
    if info.tzdata is None:
        return "- (no cron times computed yet)"
    return f"{info.tzdata} ({info.tzdata_source})"


def state_of(info: ScheduleInfo) -> str:
    if info.done:
        return "done"
    return "paused" if info.paused else "active"


def _on_schedule(
    redis: str, prefix: str, queue: str, name: str, method: str, *args: Any, **kwargs: Any
) -> Any:
    """``schedules.<method>(name, ...)`` of a queue that must exist; no such schedule fails."""
    with session(redis, prefix) as s:
        schedules = s.existing(queue).schedules
        try:
            return getattr(schedules, method)(name, *args, **kwargs)
        except ScheduleNotFound:
            raise CliError(f"no schedule {name!r} in queue {queue!r}") from None


@schedules_app.command("list")
def list_(
    queue: QueueArg,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """Every schedule of a queue, with its next fire and counters.

    Example: delayq schedules list orders
    """
    with session(redis, prefix) as s:
        infos = s.existing(queue).schedules.list(upcoming=1)
    if json:
        render.print_json([info_json(i) for i in infos])
        return
    table = Table(title=f"schedules of {queue}", **render.COMPACT)
    for column in ("name", "when", "state", "next fire", "last", "fired", "skipped", "missed"):
        table.add_column(column)
    for i in infos:
        table.add_row(
            render.safe(i.name), render.safe(spec_text(i)), state_of(i),
            render.when(i.next_fire and i.next_fire.astimezone(UTC)),
            render.safe(i.last_outcome or "-"),
            str(i.fired), str(i.skipped), str(i.missed),
        )  # fmt: skip
    out.print(table)


@schedules_app.command("show")
def show(
    queue: QueueArg,
    name: NameArg,
    count: Annotated[int, typer.Option("--next", min=1, max=100, help="Fire times shown.")] = 5,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
    json: JsonOpt = False,
) -> None:
    """One schedule: its spec in plain English, the next fire times and what happened last.

    Example: delayq schedules show orders nightly-report --next 10
    """
    info = _on_schedule(redis, prefix, queue, name, "get", upcoming=count)
    if info is None:
        raise CliError(f"no schedule {name!r} in queue {queue!r}")
    if json:
        render.print_json(info_json(info))
        return
    rows = [
        ("schedule", info.name),
        ("when", f"{info.schedule.cron or spec_text(info)}: {info.schedule.explain()}"),
        ("state", state_of(info) + (f" ({info.note})" if info.note else "")),
        ("policies", f"overlap={info.overlap} catchup={info.catchup}"
         + (f" window={info.catchup_window:g}s" if info.catchup_window else "")
         + (f" jitter={info.jitter:g}s" if info.jitter else "")
         + (f" max_fires={info.max_fires}" if info.max_fires else "")),
        ("version", str(info.version)),
        ("payload", payload_text(info)),
        ("tzdata", tzdata_text(info)),
        ("last fire", render.when(info.last_fire and info.last_fire.astimezone(UTC))),
        ("last success", render.when(info.last_success)),
        ("last outcome", info.last_outcome or "-"),
        ("counters", f"fired {info.fired}, skipped {info.skipped}, missed {info.missed}, "
         f"manual {info.manual}, backfilled {info.backfilled}, running {info.running}"),
    ]  # fmt: skip
    table = Table(show_header=False, **render.COMPACT)
    table.add_column()
    table.add_column()
    for label, value in rows:
        table.add_row(label, render.safe(value))
    for k, moment in enumerate(info.next_fires):
        local = moment.strftime("%Y-%m-%d %H:%M:%S %Z")
        table.add_row("next fires" if k == 0 else "", f"{local} ({render.relative(moment)})")
    out.print(table)


@schedules_app.command("pause")
def pause(
    queue: QueueArg,
    name: NameArg,
    note: Annotated[str | None, typer.Option(metavar="TEXT", help="Why (shown by show).")] = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """Stop firing a schedule (its place in time is kept).

    Example: delayq schedules pause orders nightly-report --note "db migration"
    """
    done = _on_schedule(redis, prefix, queue, name, "pause", note)
    say(f"schedule {name} paused" if done else f"schedule {name} was paused already")


@schedules_app.command("resume")
def resume(
    queue: QueueArg, name: NameArg, redis: RedisOpt = DEFAULT_URL, prefix: PrefixOpt = "dq"
) -> None:
    """Fire a paused schedule again from now on (backfill replays the paused fires).

    Example: delayq schedules resume orders nightly-report
    """
    done = _on_schedule(redis, prefix, queue, name, "resume")
    say(f"schedule {name} resumed" if done else f"schedule {name} was not paused")


@schedules_app.command("remove")
def remove(
    queue: QueueArg, name: NameArg, redis: RedisOpt = DEFAULT_URL, prefix: PrefixOpt = "dq"
) -> None:
    """Remove a schedule; fires already due stay queued.

    Example: delayq schedules remove orders nightly-report
    """
    if not _on_schedule(redis, prefix, queue, name, "remove"):
        raise CliError(f"no schedule {name!r} in queue {queue!r}")
    say(f"schedule {name} removed")


@schedules_app.command("trigger")
def trigger(
    queue: QueueArg,
    name: NameArg,
    request: RequestOpt = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """One run now, obeying the overlap policy; prints the fire's task id.

    Example: delayq schedules trigger orders nightly-report --request rerun-0601
    """
    fired = _on_schedule(redis, prefix, queue, name, "trigger", request=request)
    if fired is None:
        raise CliError(f"schedule {name} has a fire running: skipped (overlap policy)")
    say(fired)


@schedules_app.command("backfill")
def backfill(
    queue: QueueArg,
    name: NameArg,
    start: Annotated[str, typer.Option(metavar="TIME", help="First time (ISO 8601 with zone).")],
    end: Annotated[str, typer.Option(metavar="TIME", help="Last time (ISO 8601 with zone).")],
    request: RequestOpt = None,
    redis: RedisOpt = DEFAULT_URL,
    prefix: PrefixOpt = "dq",
) -> None:
    """One fire, due now, per fire time in [start, end] (at most 100).

    Example: delayq schedules backfill orders nightly-report --start 2030-06-01T00:00Z
    --end 2030-06-03T00:00Z
    """
    first, last = parse.timestamp(start, "--start"), parse.timestamp(end, "--end")
    offered = _on_schedule(redis, prefix, queue, name, "backfill", first, last, request=request)
    say(f"{offered} fire(s) of {name} offered")


app.add_typer(schedules_app, name="schedules")
