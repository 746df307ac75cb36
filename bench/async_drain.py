"""One asyncio worker's drain of a burst, in-process: ``python -m bench.async_drain [N]``.

N due tasks (default 50,000) on a private redis-server, one ``AsyncWorker`` with its
defaults and a no-op handler; prints tasks/s, Redis CPU and this process's CPU per task.
Client CPU is the steadier figure on a shared machine: run two trees alternately with
``PYTHONPATH=<tree>/src`` to compare them (docs/benchmarks-core.md).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import redis

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue
from delayq.embedded import EmbeddedRedis, find_redis_server


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def drain(url: str, prefix: str, n: int) -> tuple[float, float]:
    """Seconds and this process's CPU seconds from the worker's start to the n-th handler."""
    handled = 0
    all_done = asyncio.Event()

    async def handler(task: Any) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            all_done.set()

    async with AsyncDelayQueue("burst", url, prefix=prefix) as queue:
        worker = AsyncWorker(queue, handler, handle_signals=False)
        running = asyncio.create_task(worker.run())
        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.wait_for(all_done.wait(), 300)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        worker.stop()
        await running
    return elapsed, cpu


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with EmbeddedRedis(find_redis_server()) as server:
        prefix = f"bench-drain-{uuid.uuid4().hex[:8]}"
        with DelayQueue("burst", server.url, prefix=prefix) as queue:
            for start in range(0, n, 5000):
                queue.offer_many([(i, 0) for i in range(start, min(n, start + 5000))])
        client = redis.Redis.from_url(server.url)
        before = redis_cpu_s(client)
        elapsed, cpu = asyncio.run(drain(server.url, prefix, n))
        redis_us = (redis_cpu_s(client) - before) * 1e6 / n
        client.close()
    client_us = cpu * 1e6 / n
    print(f"{n / elapsed:.0f} tasks/s, µs/task: redis {redis_us:.2f}, client {client_us:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
