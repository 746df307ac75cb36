"""Worker side of the saq contestant: ``saq bench.peers.saq_app.settings``."""

from __future__ import annotations

from typing import Any

from saq import Queue

from .base import Sink, from_env

_url, _queue, _sink_path, _hold = from_env()
SINK = Sink(_sink_path, _hold)


async def handle(ctx: dict[str, Any], *, i: int, due: float, pad: str) -> None:
    await SINK.arecord(i, due)


settings = {
    "queue": Queue.from_url(_url, name=_queue),
    "functions": [handle],
}
