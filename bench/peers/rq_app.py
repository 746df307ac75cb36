"""Worker side of the rq contestant (``rq worker`` imports ``handle`` by its dotted name)."""

from __future__ import annotations

import os
from typing import Any

from .base import ENV_HOLD, ENV_SINK, Sink

_SINK: Sink | None = None


def handle(data: dict[str, Any]) -> None:
    global _SINK
    if _SINK is None:  # opened in the process that runs the job (rq forks one per job)
        _SINK = Sink(os.environ[ENV_SINK], os.environ.get(ENV_HOLD) == "1")
    _SINK.record(data["i"], data["due"])
