"""Parsing of command-line values: durations, sizes, due times, headers, payloads, handler
targets."""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .._core.sizes import parse_size
from .._core.timing import parse_duration

_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class BadValue(ValueError):
    """A command-line value that cannot be used; the message names the option."""


def duration(text: str, option: str) -> float:
    """Seconds from ``1.5``, ``30s``, ``5m``, ``1h30m``, ``250ms`` or ``2d``."""
    try:
        return parse_duration(text, f"duration for {option}")
    except ValueError as exc:
        raise BadValue(str(exc)) from None


def size(text: str, option: str) -> int:
    """Bytes from ``4194304``, ``4MiB``, ``512KiB`` or ``1GiB``."""
    try:
        return parse_size(text, f"size for {option}")
    except ValueError as exc:
        raise BadValue(str(exc)) from None


def timestamp(text: str, option: str = "--at") -> datetime:
    """An ISO 8601 time with a timezone (``Z`` or ``+02:00``)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadValue(
            f"{option}: {text!r} is not an ISO 8601 time (e.g. 2030-01-31T09:30:00+01:00)"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise BadValue(f"{option}: {text!r} has no timezone; add Z or an offset like +01:00")
    return when


def log_level(text: str) -> int:
    """The logging level named ``text`` (DEBUG, info, ...)."""
    level = logging.getLevelName(text.upper())
    if not isinstance(level, int):
        raise BadValue(f"--log-level: unknown level {text!r}")
    return level


def headers(items: list[str] | None) -> dict[str, str]:
    """``k=v`` pairs as a dict."""
    result = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise BadValue(f"--header: {item!r} is not of the form name=value")
        result[name] = value
    return result


def payload(text: str) -> Any:
    """The task payload, parsed as JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadValue(f"PAYLOAD_JSON is not valid JSON ({exc}): {text[:80]!r}") from None


def target(text: str) -> Callable[..., Any]:
    """The handler named by ``module:function`` (the current directory is importable)."""
    if not _TARGET.fullmatch(text):
        raise BadValue(
            f"TARGET must be module:function (e.g. myapp.tasks:close_order), got {text!r}"
        )
    module_name, _, attr = text.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules in the current directory
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise BadValue(f"TARGET {text!r}: no module named {exc.name!r}") from None
        raise BadValue(f"TARGET {text!r}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # the user's module can raise anything while importing
        raise BadValue(
            f"TARGET {text!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BadValue(f"TARGET {text!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise BadValue(f"TARGET {text!r} is not callable")
    return obj  # type: ignore[no-any-return]
