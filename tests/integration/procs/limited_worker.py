"""A worker process for the flow-control tests (issue #20).

Usage: ``python limited_worker.py URL PREFIX QUEUE [--kind thread|async] [--concurrency N]
[--visibility S] [--sleep S] [--max-seconds S]``

Runs :class:`delayq.Worker` (``--kind thread``) or :class:`delayq.AsyncWorker` on the queue and
prints ``ready <pid>`` once listening. For each task the handler sleeps ``--sleep`` seconds,
then pushes one JSON line ``{"id", "payload", "attempts", "start_ms", "end_ms", "pid"}`` to
the Redis list ``PREFIX:handled``: ``start_ms`` is the server's hand-out time, ``end_ms`` this
machine's clock after the handler (a lease ends at its ack, a little later). A watchdog ends
the process with exit code 3 after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aredis

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Worker


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("queue")
    parser.add_argument("--kind", choices=["thread", "async"], default="thread")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--visibility", type=float, default=30.0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    return parser.parse_args()


def record(task: Any) -> str:
    return json.dumps(
        {
            "id": task.id,
            "payload": task.payload,
            "attempts": task.attempts,
            "start_ms": int(task.delivered_at.timestamp() * 1000),
            "end_ms": int(time.time() * 1000),
            "pid": os.getpid(),
        }
    )


def options(args: argparse.Namespace) -> dict[str, Any]:
    return {"prefix": args.prefix, "visibility_timeout": args.visibility, "safety_interval": 5}


def run_thread(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(args.url)

    def handler(task: Any) -> None:
        time.sleep(args.sleep)
        client.rpush(f"{args.prefix}:handled", record(task))

    with DelayQueue(args.queue, args.url, **options(args)) as queue:
        queue.poll(timeout=0)
        worker = Worker(queue, handler, concurrency=args.concurrency, handle_signals=True)
        print(f"ready {os.getpid()}", flush=True)
        worker.run()


async def run_async(args: argparse.Namespace) -> None:
    client = aredis.Redis.from_url(args.url)

    async def handler(task: Any) -> None:
        await asyncio.sleep(args.sleep)
        await client.rpush(f"{args.prefix}:handled", record(task))

    async with AsyncDelayQueue(args.queue, args.url, **options(args)) as queue:
        await queue.poll(timeout=0)
        worker = AsyncWorker(queue, handler, concurrency=args.concurrency, handle_signals=True)
        print(f"ready {os.getpid()}", flush=True)
        await worker.run()


def main() -> int:
    args = parse()

    def expire() -> None:
        time.sleep(args.max_seconds)
        os._exit(3)

    threading.Thread(target=expire, daemon=True).start()
    if args.kind == "thread":
        run_thread(args)
    else:
        asyncio.run(run_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
