"""Worker side of the docket contestants, in ``.venv-bench-docket``.

``docket worker --tasks bench.peers.docket_app:tasks`` runs :func:`handle`; ``python -m
bench.peers.docket_app enqueue ...`` enqueues (:func:`bench.peers._own_venv.serve`);
``python -m bench.peers.docket_app worker --scheduling-resolution-ms N URL QUEUE`` is the tuned
worker: docket's CLI parses durations as whole seconds ("250ms" is refused), so a sub-second
resolution goes through ``Worker.run``, the function the CLI calls, with the CLI's other
defaults.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta

from docket import Docket, Worker

from ._own_venv import serve
from .base import ENV_HOLD, ENV_SINK, Job, Sink, payload

SINK = Sink(os.environ.get(ENV_SINK, os.devnull), os.environ.get(ENV_HOLD) == "1")


async def handle(i: int, due: float, pad: str) -> None:
    await SINK.arecord(i, due)


#: the task collection ``docket worker --tasks`` registers
tasks = [handle]


def when(job: Job) -> datetime:
    return datetime.fromtimestamp(job.due, UTC)


async def enqueue(url: str, queue: str, jobs: list[Job], bulk: bool) -> float:
    async with Docket(name=queue, url=url) as docket:
        docket.register(handle)
        async with docket.redis() as redis:
            await redis.ping()
        start = time.perf_counter()
        if bulk:  # add_many pipelines the schedules, 1,000 per round trip by default
            await docket.add_many(docket.call(handle, when=when(j))(**payload(j)) for j in jobs)
        else:
            for j in jobs:
                await docket.add(handle, when=when(j))(**payload(j))
        return time.perf_counter() - start


def tuned_worker(args: list[str]) -> None:
    flag, resolution_ms, url, queue = args
    assert flag == "--scheduling-resolution-ms", args
    asyncio.run(
        Worker.run(
            docket_name=queue,
            url=url,
            tasks=["bench.peers.docket_app:tasks"],
            scheduling_resolution=timedelta(milliseconds=float(resolution_ms)),
        )
    )


if __name__ == "__main__":
    serve(enqueue, {"worker": tuned_worker})
