"""The one line an operator wants from a stored error text: the exception's type and message.

A failed task's error, as the worker records it, is a formatted traceback (see
``handling.describe``): the frames first, ``RuntimeError: boom`` last. Lists of dead letters
show only that last part; the full text stays on the task's own view. Pure functions, used by
the CLI and the dashboard alike.
"""

from __future__ import annotations

import re

# The lines of a formatted traceback that are not the exception itself: the header, the frame
# lines ("  File ...", then the indented source and caret lines) and the chain separators.
_HEADER = "Traceback (most recent call last):"
_FRAME = "  File "


def error_summary(text: str | None, width: int | None = None) -> str:
    """The exception part of an error text on one line: ``RuntimeError: boom``.

    For a traceback that is what follows its last frame (a multi-line message is joined with
    spaces); any other text is returned with its whitespace collapsed. A text cut at its
    start (the stored error keeps the last few thousand characters) works the same way. With
    ``width``, the result is cut to that many characters, ending in ``…``. ``None`` or an
    empty text gives ``""``."""
    if not text:
        return ""
    lines = text.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line.startswith(_FRAME)), default=-1)
    if last_frame >= 0:
        rest = lines[last_frame + 1 :]
        # Skip the frame's indented source and caret lines; the exception starts unindented.
        start = next((i for i, line in enumerate(rest) if line[:1] not in (" ", "\t")), None)
        tail = rest[start:] if start is not None else []
        summary = " ".join(" ".join(tail).split())
    else:
        summary = " ".join(line for line in (" ".join(x.split()) for x in lines) if line)
        if summary.startswith(_HEADER):  # a header with no frames: nothing better to show
            summary = summary[len(_HEADER) :].strip()
    if not summary:  # only frames survived the cut: the innermost frame is the best clue
        summary = " ".join(lines[last_frame].split()) if last_frame >= 0 else ""
    if width is not None and len(summary) > width:
        summary = summary[: max(width - 1, 0)] + "…"
    return summary


def bind_error(host: str, port: int, exc: OSError) -> OSError:
    """The refusal to bind ``host:port`` (a busy port, an unknown host) as an OSError that
    names the address, which the bare one does not: ``cannot listen on 127.0.0.1:9808:
    address already in use`` (errno kept)."""
    reason = (exc.strerror or str(exc)).lower()
    error = OSError(f"cannot listen on {host}:{port}: {reason}")
    error.errno = exc.errno
    return error


# redis-py's "No master found" names each sentinel it asked by the client's whole repr (its
# pool and connection options: a thousand characters), then " - " and that sentinel's error.
_SENTINEL_REPR = re.compile(r"<redis\.(?:asyncio\.)?client\.Redis\((?P<inner>.*?)\)> - ")
_ADDRESS = re.compile(r"\bhost=(?P<host>[^,)>]+),port=(?P<port>\d+)")


def redis_error_text(error: BaseException | str) -> str:
    """``error``'s text with each sentinel client redis-py wrote out whole shortened to its
    address: ``No master found for 'mymaster' : sentinel 10.0.0.5:26379: ConnectionError...``."""

    def address(found: re.Match[str]) -> str:
        where = _ADDRESS.search(found.group("inner"))
        return f"sentinel {where.group('host')}:{where.group('port')}: " if where else "sentinel: "

    return _SENTINEL_REPR.sub(address, str(error))
