"""delayq for an arq user: enqueue_job(..., _defer_by=...) becomes offer(delay=...)."""

import asyncio
import os
from datetime import timedelta

from delayq import AsyncDelayQueue, AsyncTask, AsyncWorker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
charged: list[int] = []


# --8<-- [start:usage]
async def charge(task: AsyncTask) -> None:  # arq: async def charge(ctx, order_id)
    charged.append(task.payload["order_id"])


async def main() -> None:
    async with AsyncDelayQueue("payments", redis=REDIS_URL) as queue:
        # enqueue_job("charge", 42, _defer_by=timedelta(minutes=5), _job_id="c-42")
        await queue.offer({"order_id": 42}, delay=timedelta(minutes=5), id="c-42")
        # _defer_until=datetime(...)  ->  at=datetime(...)
        # WorkerSettings.functions = [charge]  ->  an AsyncWorker
        worker = AsyncWorker(queue, charge, concurrency=64)
        # --8<-- [end:usage]
        await check(queue, worker)


async def check(queue: AsyncDelayQueue, worker: AsyncWorker) -> None:
    info = await queue.get("c-42")
    assert info is not None and info.state == "delayed"
    await queue.offer({"order_id": 43})  # due now
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        while charged != [43]:
            await asyncio.sleep(0.05)
    worker.stop()
    await running


asyncio.run(main())
