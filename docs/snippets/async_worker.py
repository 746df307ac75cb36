"""An AsyncWorker runs `async def` handlers, many at a time on one event loop."""

import asyncio
import os

from delayq import AsyncDelayQueue, AsyncTask, AsyncWorker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
reminded: list[str] = []


async def send_reminder(task: AsyncTask) -> None:
    await asyncio.sleep(0.01)  # an HTTP call to the mail service, say
    reminded.append(task.payload["email"])


async def main() -> None:
    async with AsyncDelayQueue("reminders", redis=REDIS_URL) as queue:
        for n in range(10):
            await queue.offer({"email": f"user{n}@example.com"}, delay=0.2 + n / 100)
        worker = AsyncWorker(queue, send_reminder, concurrency=64, handle_signals=False)
        running = asyncio.create_task(worker.run())
        while len(reminded) < 10:  # an application stops its worker at shutdown instead
            await asyncio.sleep(0.05)
        worker.stop()
        await running
    print("reminded", len(reminded), "users")


asyncio.run(main())
