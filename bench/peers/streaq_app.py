"""Worker side of the streaq contestant, in ``.venv-bench-streaq``:
``streaq run bench.peers.streaq_app:worker``; ``python -m bench.peers.streaq_app enqueue ...``
enqueues (:func:`bench.peers._own_venv.serve`)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from streaq import Worker

from ._own_venv import serve
from .base import ENV_HOLD, ENV_QUEUE, ENV_SINK, ENV_URL, Job, Sink, payload

SINK = Sink(os.environ.get(ENV_SINK, os.devnull), os.environ.get(ENV_HOLD) == "1")

worker = Worker(redis_url=os.environ[ENV_URL], queue_name=os.environ.get(ENV_QUEUE, "bench"))


# silent: streaq logs every task start and end at INFO, and its CLI has no quieter level
@worker.task(silent=True)
async def handle(i: int, due: float, pad: str) -> None:
    await SINK.arecord(i, due)


async def enqueue(url: str, queue: str, jobs: list[Job], bulk: bool) -> float:
    # the Worker above was built from the same URL and queue (BENCH_* set by the contestant)
    async with worker:
        await worker.redis.ping()
        start = time.perf_counter()
        tasks = (
            handle.enqueue(**payload(j)).start(schedule=datetime.fromtimestamp(j.due, UTC))
            for j in jobs
        )
        if bulk:  # one pipeline for the whole list
            await worker.enqueue_many(list(tasks))
        else:
            for task in tasks:
                await task
        return time.perf_counter() - start


if __name__ == "__main__":
    serve(enqueue)
