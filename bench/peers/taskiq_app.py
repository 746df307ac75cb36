"""Worker side of the taskiq contestants, in ``.venv-bench-taskiq``.

``python -m bench.peers.taskiq_app serve [SCHEDULER-ARGS...]`` runs ``taskiq worker
bench.peers.taskiq_app:broker --workers 1`` and ``taskiq scheduler
bench.peers.taskiq_app:scheduler SCHEDULER-ARGS`` as one process group
(:func:`bench.peers._own_venv.run_together`); ``python -m bench.peers.taskiq_app enqueue ...``
enqueues (:func:`bench.peers._own_venv.serve`).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from taskiq import TaskiqScheduler
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

from ._own_venv import run_together, serve
from .base import ENV_HOLD, ENV_QUEUE, ENV_SINK, ENV_URL, Job, Sink, payload

SINK = Sink(os.environ.get(ENV_SINK, os.devnull), os.environ.get(ENV_HOLD) == "1")

_url, _queue = os.environ[ENV_URL], os.environ.get(ENV_QUEUE, "bench")
broker = RedisStreamBroker(url=_url, queue_name=_queue)
source = ListRedisScheduleSource(_url)
scheduler = TaskiqScheduler(broker, sources=[source])


@broker.task(task_name="handle")
async def handle(i: int, due: float, pad: str) -> None:
    await SINK.arecord(i, due)


async def enqueue(url: str, queue: str, jobs: list[Job], bulk: bool) -> float:
    # broker and source above were built from the same URL and queue (BENCH_* set by the
    # contestant); the broker is needed for tasks due now, which go straight to the stream
    await broker.startup()
    await source.startup()
    try:
        start = time.perf_counter()
        for j in jobs:
            if j.due > time.time():
                await handle.schedule_by_time(
                    source, datetime.fromtimestamp(j.due, UTC), **payload(j)
                )
            else:
                await handle.kiq(**payload(j))
        return time.perf_counter() - start
    finally:
        await source.shutdown()
        await broker.shutdown()


def serve_with_scheduler(scheduler_args: list[str]) -> None:
    taskiq = str(Path(sys.executable).parent / "taskiq")
    quiet = ["--log-level", "WARNING"]  # INFO logs every task sent and run
    run_together(
        [
            [taskiq, "worker", f"{__spec__.name}:broker", "--workers", "1", *quiet],
            [taskiq, "scheduler", f"{__spec__.name}:scheduler", *quiet, *scheduler_args],
        ]
    )


if __name__ == "__main__":
    serve(enqueue, {"serve": serve_with_scheduler})
