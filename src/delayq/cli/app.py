"""The ``delayq`` command: operate queues from the shell and run workers.

Every command takes ``--redis`` (default: ``$REDIS_URL``, then ``redis://127.0.0.1:6379/0``)
and ``--prefix`` (default ``dq``). A password in ``--redis`` is visible to every user of the
machine (``ps``); ``REDIS_URL`` in the environment is not. Errors are one line on stderr and a
non-zero exit code: 2 for bad arguments, 1 for everything else (unknown queue or task, Redis
unreachable, ...). No message shows a password: URLs go through ``safe_url``.

Everything read from Redis reaches the terminal escaped (see render.py); ``--json`` is exact.

This module only builds the root command. The commands live in one module per role, each a
``typer.Typer`` of its own over common.py (the shared options, session and errors): tasks.py
(schedule), views.py (read), repair.py (fix), serving.py (run), outbox.py, reshard.py and
redisson.py, schedules.py (recurring schedules) and limits.py (flow control).
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from .. import __version__
from . import helptext, limits, outbox, redisson, repair, reshard, schedules, serving, tasks, views
from .common import invoke, say

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


# The role modules' commands become top-level ones (delayq offer, delayq stats, ...) and their
# groups stay groups (delayq outbox ...). `delayq --help` lists the commands in this order,
# then the groups. They are copied onto the root rather than mounted with a nameless
# add_typer(part): typer before 0.15 drops such a part's commands, and we allow typer 0.12.
for part in (
    tasks.app,
    views.app,
    repair.app,
    serving.app,
    outbox.app,
    reshard.app,
    redisson.app,
    schedules.app,
    limits.app,
):
    app.registered_commands.extend(part.registered_commands)
    app.registered_groups.extend(part.registered_groups)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.getLogger("delayq").addHandler(logging.NullHandler())  # errors are ours to print
    command = helptext.quiet(typer.main.get_command(app))
    return invoke(command, args or ["--help"])
