"""Worker side of the arq contestant: ``arq bench.peers.arq_app.WorkerSettings``."""

from __future__ import annotations

from typing import Any

from arq.connections import RedisSettings

from .base import Sink, from_env

_url, _queue, _sink_path, _hold = from_env()
SINK = Sink(_sink_path, _hold)


async def handle(ctx: dict[str, Any], data: dict[str, Any]) -> None:
    await SINK.arecord(data["i"], data["due"])


class WorkerSettings:
    functions = [handle]
    redis_settings = RedisSettings.from_dsn(_url)
    queue_name = _queue
