"""Text from Redis made safe to show: no lone surrogates, no terminal control sequences.

Anything a task carries (payloads, ids, headers, error texts, queue names) may come from
another producer or an attacker. Before it reaches a terminal, a log line or an encoder that
insists on valid UTF-8, it goes through one of these functions.
"""

from __future__ import annotations

import re

# C0 and C1 controls (tab and newline are kept only by ``printable(..., keep_newlines=True)``),
# DEL, and the bidi overrides/isolates that reorder what a reader sees (Trojan Source).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]|[\ud800-\udfff]")
_UNSAFE_NO_NEWLINES = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]|[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` (str, bytes or anything with a ``str()``) with every control, bidi and lone
    surrogate character shown as an escape (``\\x1b``, ``\\u202e``, ``\\udcff``), so that it
    cannot move the cursor, recolour a terminal or reorder a line. Bytes that are not UTF-8
    are shown with backslash escapes."""
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", errors="backslashreplace")
    elif not isinstance(text, str):
        text = str(text)
    pattern = _UNSAFE if keep_newlines else _UNSAFE_NO_NEWLINES
    return pattern.sub(_escape, text)


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates replaced by escapes, so that it encodes as UTF-8; every
    other character is kept as it is (for error texts stored in Redis)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def is_printable(text: str) -> bool:
    """Whether ``text`` would be shown unchanged by :func:`printable`."""
    return _UNSAFE_NO_NEWLINES.search(text) is None
