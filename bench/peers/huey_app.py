"""Worker side of the huey contestant: ``huey_consumer bench.peers.huey_app.huey``."""

from __future__ import annotations

from typing import Any

from huey import RedisHuey

from .base import Sink, from_env

_url, _queue, _sink_path, _hold = from_env()
SINK = Sink(_sink_path, _hold)

huey = RedisHuey(_queue, url=_url)


@huey.task(name="handle")
def handle(data: dict[str, Any]) -> None:
    SINK.record(data["i"], data["due"])
