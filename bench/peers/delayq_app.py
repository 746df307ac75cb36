"""Worker-side handlers for the delayq contestants (run by ``delayq worker``)."""

from __future__ import annotations

from typing import Any

from .base import Sink, from_env

_url, _queue, _sink_path, _hold = from_env()
SINK = Sink(_sink_path, _hold)


def handle(task: Any) -> None:
    SINK.record(task.payload["i"], task.payload["due"])


async def handle_async(task: Any) -> None:
    await SINK.arecord(task.payload["i"], task.payload["due"])
