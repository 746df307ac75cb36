"""delayq for a BullMQ user: queue.add(name, data, {delay}) becomes offer(data, delay=...)."""

import asyncio
import os

from delayq import AsyncDelayQueue, AsyncTask, AsyncWorker, Backoff

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
sent: list[str] = []


# --8<-- [start:usage]
async def send(task: AsyncTask) -> None:  # the processor: async (job) => {...}
    sent.append(task.payload["to"])


async def main() -> None:
    # attempts and backoff are options of the queue here, not of each job
    queue = AsyncDelayQueue(
        "mails", redis=REDIS_URL, max_attempts=5, retry_backoff=Backoff(base=1.0)
    )
    # queue.add("welcome", {to: "ada@..."}, {delay: 60000, jobId: "w-ada"})
    await queue.offer({"to": "ada@example.com"}, delay=60, id="w-ada")  # in s
    # await job.changeDelay(120000)
    await queue.reschedule("w-ada", delay=120)
    worker = AsyncWorker(queue, send, concurrency=16)
    # --8<-- [end:usage]
    await check(queue, worker)
    await queue.close()


async def check(queue: AsyncDelayQueue, worker: AsyncWorker) -> None:
    info = await queue.get("w-ada")
    assert info is not None and info.due_at is not None
    await queue.offer({"to": "bob@example.com"})
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        while sent != ["bob@example.com"]:
            await asyncio.sleep(0.05)
    worker.stop()
    await running


asyncio.run(main())
