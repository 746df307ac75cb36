"""Quick start with asyncio: the same methods, awaited."""

import asyncio
import os

from delayq import AsyncDelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


async def main() -> None:
    async with AsyncDelayQueue("orders", redis=REDIS_URL) as queue:
        await queue.offer({"order_id": 44}, delay=0.5)
        task = await queue.take()
        print(f"closing order {task.payload['order_id']}")
        await task.ack()


asyncio.run(main())
