"""Options the management commands share."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser


def add_metrics_options(parser: CommandParser, what: str) -> None:
    """``--metrics-port`` and ``--metrics-host``; ``what`` says what /metrics holds."""
    parser.add_argument("--metrics-port", type=int, help=f"Serve Prometheus /metrics ({what}).")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="Address for --metrics-port.")


def metrics_address(options: dict[str, Any]) -> tuple[int, str] | None:
    """The port and host asked for, or None; a port out of range is a CommandError."""
    port = options.get("metrics_port")
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise CommandError(f"--metrics-port must be from 0 to 65535, got {port}")
    return port, str(options["metrics_host"])
