"""What every ``delayq`` command shares: the option types, the consoles, the errors, the
Redis session and the translation of a failure into one ``error:`` line and an exit code.

The command modules (tasks, views, repair, serving, outbox, reshard) import this module; it
imports none of them, so the CLI's imports point one way (tests/unit/test_cli_layout.py).
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from redis.exceptions import RedisClusterException, RedisError
from rich.console import Console
from rich.text import Text

from .. import Connection, DelayqError, DelayQueue
from .._core.keys import KEY_ROLES, QueueKeys
from .._core.registry import Registry, registry_key
from .._core.text import printable
from .._core.urls import mask_secrets, safe_url
from ..exceptions import ConfigError
from . import parse, render

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CALL_TIMEOUT = 3.0  # seconds a command keeps retrying an unreachable Redis (reconnect_timeout)
CLIENT_NAME = "delayq-cli"  # the CLIENT SETNAME of a command's connections
MAX_LIMIT = 10_000  # most tasks one page of inspect or dead lists

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
    expired = "expired"
    dead = "dead"


def redis_help() -> str:
    """--redis's help: the default it names is the one a command without --redis uses,
    ``$REDIS_URL`` (its password masked) when that is set."""
    url = os.environ.get("REDIS_URL")
    default = f"$REDIS_URL = {safe_url(url)}" if url else f"$REDIS_URL, else {DEFAULT_URL}"
    return (
        f"Redis URL, or env:NAME / file:PATH to read it from there (default: {default}). "
        "A password given here shows in ps: use REDIS_URL, env: or file:."
    )


def read_source(value: str) -> str:
    """``value``, or what ``env:NAME`` (that environment variable) or ``file:PATH`` (the
    file's first line) points to: a secret given so never shows in ``ps``. Raises
    :class:`ValueError` saying what is missing."""
    if value.startswith("env:"):
        found = os.environ.get(value[4:])
        if not found:
            raise ValueError(f"{value}: the environment variable is not set")
        return found
    if value.startswith("file:"):
        try:
            with open(value[5:], encoding="utf-8") as fh:
                first = fh.readline().strip()
        except OSError as exc:
            raise ValueError(f"{value}: {exc.strerror}") from None
        if not first:
            raise ValueError(f"{value}: the file is empty")
        return first
    return value


def from_source(value: str, option: str) -> str:
    """:func:`read_source` for a value a command reads itself (``--dsn``)."""
    try:
        return read_source(value)
    except ValueError as exc:
        raise CliError(f"{option} {exc}", code=2) from None


def _redis_source(value: str) -> str:
    try:
        return read_source(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


RedisOpt = Annotated[
    str,
    typer.Option(
        "--redis",
        envvar="REDIS_URL",
        metavar="URL",
        help=redis_help(),
        callback=_redis_source,
        show_envvar=False,
        show_default=False,
    ),
]
PrefixOpt = Annotated[
    str, typer.Option("--prefix", metavar="PREFIX", help="Key prefix of the queues.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON on stdout, for scripts.")]
QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.", show_default=False)]
DelayOpt = Annotated[
    str | None,
    typer.Option(
        "--delay", "-d", metavar="DURATION", help="Delay: 30s, 5m, 1h30m, 250ms or seconds."
    ),
]
AtOpt = Annotated[
    str | None,
    typer.Option("--at", metavar="TIME", help="Due time, ISO 8601 with a timezone."),
]
AllowMissingOpt = Annotated[
    bool,
    typer.Option(
        "--allow-missing",
        help="Show an unknown queue as empty instead of failing. A queue is known when the "
        "registry (PREFIX:queues) lists it or it holds any key.",
    ),
]
LimitOpt = Annotated[
    int,
    typer.Option(min=0, max=MAX_LIMIT, metavar="N", help=f"Most tasks to list (<= {MAX_LIMIT})."),
]


def bad(message: str) -> NoReturn:
    raise CliError(message, code=2)


def say(text: str) -> None:
    """One line on stdout, escaped of control characters, never parsed for markup or cut."""
    out.print(Text(printable(text)), soft_wrap=True)


def plural(count: int, noun: str) -> str:
    """``1 dead task``, ``2 dead tasks``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def warn(text: str) -> None:
    err.print(Text(printable(text)), soft_wrap=True)


def say_done(verb: str, done: dict[str, bool], missed: list[str], *, json: bool) -> None:
    """What a command did to each task id: ``{verb: [ids done], "missed": missed}`` as JSON,
    else a line ``<verb> <id>`` per id done."""
    if json:
        render.print_json({verb: [i for i, ok in done.items() if ok], "missed": missed})
        return
    for task_id, ok in done.items():
        if ok:
            say(f"{verb} {task_id}")


def log_to_stderr(level: int = logging.INFO) -> None:
    """The log lines of a command that is the program (a Redis outage, dead rows) go to
    stderr."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


# The roles of a queue's keys that hold data (the events channel is no key); and those that
# hold tasks (what is left without them is lifetime counters and kept dedup keys).
DATA_ROLES = tuple(role for role in KEY_ROLES if role != "events")
TASK_ROLES = ("delayed", "tasks", "inflight", "dead")


class Session:
    """One connection handle (``delayq.connect``) shared by the queues a command touches."""

    def __init__(self, url: str, prefix: str) -> None:
        QueueKeys(prefix, "x")  # validates the prefix
        self.url, self.prefix = url, prefix
        try:
            self.conn = Connection(
                url, reconnect_timeout=CALL_TIMEOUT, prefix=prefix, client_name=CLIENT_NAME
            )
        except ConfigError as exc:
            bad(f"--redis: {exc}")
        except (RedisError, RedisClusterException) as exc:
            raise CliError(f"cannot reach Redis at {safe_url(url)}: {exc}") from exc
        self.runner = self.conn.runner
        self._layouts: Registry | None = None

    def queue(self, name: str, **options: Any) -> DelayQueue:
        """A queue on the command's handle (closed with the session)."""
        return self.conn.queue(name, **options)

    def existing(self, name: str) -> DelayQueue:
        """The queue, failing if it is unknown (:meth:`require`)."""
        self.require(name)
        return self.queue(name)

    def layouts(self) -> Registry:
        """The registry and the recorded layouts, read once per command."""
        if self._layouts is None:
            self._layouts = self.read_registry()
        return self._layouts

    def shard_counts(self) -> dict[str, int]:
        """The shard count Redis recorded for each sharded queue (read once per command)."""
        return self.layouts().shard_counts()

    @property
    def registry(self) -> str:
        return registry_key(self.prefix)

    def read_registry(self) -> Registry:
        """The registry ``<prefix>:queues`` and the layouts ``<prefix>:shards``, as read now."""
        try:
            return self.conn.registry()
        except (RedisError, DelayqError) as exc:
            raise CliError(f"cannot read {self.registry} from {safe_url(self.url)}: {exc}") from exc

    def registered(self, *, quiet: bool = False) -> list[str]:
        """The valid queue names in the registry, sorted (a warning for each invalid one)."""
        registry = self.read_registry()
        if not quiet:
            for name in registry.invalid:
                warn(f"warning: skipping invalid queue name {name!r} in {self.registry}")
            for error in registry.broken.values():
                warn(f"warning: skipping a queue: {printable(error)}")
        return list(registry.names)

    def holds_keys(self, name: str, roles: Sequence[str] = DATA_ROLES) -> int:
        """How many of the queue's keys (of ``roles``) exist; a sharded queue's are its
        sub-queues', during a reshard both layouts' (one EXISTS per sub-queue: each is its
        own slot)."""
        layout = self.layouts().layouts.get(name)
        names = layout.names(name) if layout is not None else [name]
        found = 0
        for part in names:
            keys = QueueKeys(self.prefix, part)
            found += int(self.runner.command("EXISTS", *(keys.key(role) for role in roles)))
        return found

    def known(self, name: str) -> bool:
        """Whether the queue exists: the registry lists it, Redis recorded its shard count,
        or it holds any key."""
        QueueKeys(self.prefix, name)  # validates the name
        if self.conn.is_registered(name):
            return True
        return name in self.shard_counts() or self.holds_keys(name) > 0

    def require(self, name: str, allow_missing: bool | None = None) -> None:
        """Fail with a clear error if the queue is unknown (a misspelt name), unless
        ``allow_missing``; None: the command has no --allow-missing."""
        if allow_missing or self.known(name):
            return
        close = difflib.get_close_matches(name, self.registered(quiet=True), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        escape = "; --allow-missing shows it as empty" if allow_missing is not None else ""
        raise CliError(
            f"unknown queue {name!r} under prefix {self.prefix!r} (not in {self.registry} "
            f"and holds no keys){hint}{escape}"
        )

    def close(self) -> None:
        """Close the handle: the queues opened on it, then its connections."""
        self.conn.close()


@contextmanager
def session(url: str, prefix: str) -> Iterator[Session]:
    s = Session(url, prefix)
    try:
        yield s
    finally:
        s.close()


# -- errors ----------------------------------------------------------------------------------


def invoke(command: Any, args: list[str]) -> int:
    """Run the built root command (a click command from ``typer.main.get_command``) on
    ``args``; returns the exit code. Every failure is one ``error:`` line (see :func:`fail`),
    never a traceback unless ``DELAYQ_DEBUG`` is set."""
    try:
        code = command.main(args, prog_name="delayq", standalone_mode=False)
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
    """Print ``message`` as one ``error:`` line: passwords masked (in URLs of every form and
    in connection strings) and control characters escaped (the text may quote Redis data)."""
    text = mask_secrets(" ".join(message.split()))  # from our own text or a library's
    sys.stderr.write(f"error: {printable(text)}\n")
    sys.stderr.flush()
    return code
