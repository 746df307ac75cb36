"""A delayq worker run as a separate process by the worker tests and the worker benchmark.

Usage: ``python worker_proc.py URL PREFIX QUEUE [--kind thread|async] [--concurrency N]
[--prefetch N] [--visibility S] [--backoff S] [--grace S] [--timeout S] [--sleep S]
[--record] [--max-seconds S]``

It builds a ``DelayQueue`` (``--kind thread``, run by :class:`delayq.Worker`) or an
``AsyncDelayQueue`` (``--kind async``, run by :class:`delayq.AsyncWorker`) with the key prefix
``PREFIX``, starts the queue's pub/sub listener with a first empty poll, prints
``ready <pid>`` and then runs the worker with its own SIGTERM/SIGINT handling.

The handler, for each task:

* pushes ``<id>`` to the Redis list ``PREFIX:started`` (with ``--record``);
* sleeps ``--sleep`` seconds (``time.sleep`` or ``asyncio.sleep``);
* pushes one JSON line ``{"id", "attempts", "pid"}`` to ``PREFIX:handled`` (with
  ``--record``), then returns, so the task is acked.

When the worker returns (after a signal) the process prints ``stopped <processed>`` and exits
0. Logs go to stdout (the tests read them). A watchdog ends the process with exit code 3 after
``--max-seconds`` so a forgotten process cannot linger.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aredis

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, Worker


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("queue")
    parser.add_argument("--kind", choices=["thread", "async"], default="thread")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=None)
    parser.add_argument("--visibility", type=float, default=30.0)
    parser.add_argument("--backoff", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--record", action="store_true", help="record started/handled ids")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    return parser.parse_args()


def queue_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "prefix": args.prefix,
        "visibility_timeout": args.visibility,
        "retry_backoff": Backoff(base=args.backoff, max=args.backoff, jitter=0.0),
        "safety_interval": 0.5,
        "reconnect_timeout": 2.0,
    }


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "concurrency": args.concurrency,
        "prefetch": args.prefetch,
        "grace": args.grace,
        "timeout": args.timeout,
        "handle_signals": True,  # a worker process of its own, stopped by SIGTERM
    }


def run_thread(args: argparse.Namespace) -> int:
    client = redis.Redis.from_url(args.url)
    started_key, handled_key, pid = f"{args.prefix}:started", f"{args.prefix}:handled", os.getpid()

    def handler(task: Any) -> None:
        if args.record:
            client.rpush(started_key, task.id)
        if args.sleep:
            time.sleep(args.sleep)
        if args.record:
            record = {"id": task.id, "attempts": task.attempts, "pid": pid}
            client.rpush(handled_key, json.dumps(record))

    queue = DelayQueue(args.queue, args.url, **queue_options(args))
    try:
        first = queue.poll(timeout=0)  # starts the listener; nothing may be due yet
        if first is not None:
            print(f"error: a task was due before the worker was ready: {first.id}", flush=True)
            return 2
        worker = Worker(queue, handler, **worker_options(args))
        print(f"ready {pid}", flush=True)
        worker.run()
        print(f"stopped {worker.health().processed}", flush=True)
        return 0
    finally:
        queue.close()
        client.close()


async def run_async(args: argparse.Namespace) -> int:
    client = aredis.Redis.from_url(args.url)
    started_key, handled_key, pid = f"{args.prefix}:started", f"{args.prefix}:handled", os.getpid()

    async def handler(task: Any) -> None:
        if args.record:
            await client.rpush(started_key, task.id)
        if args.sleep:
            await asyncio.sleep(args.sleep)
        if args.record:
            record = {"id": task.id, "attempts": task.attempts, "pid": pid}
            await client.rpush(handled_key, json.dumps(record))

    queue = AsyncDelayQueue(args.queue, args.url, **queue_options(args))
    try:
        first = await queue.poll(timeout=0)
        if first is not None:
            print(f"error: a task was due before the worker was ready: {first.id}", flush=True)
            return 2
        worker = AsyncWorker(queue, handler, **worker_options(args))
        print(f"ready {pid}", flush=True)
        await worker.run()
        print(f"stopped {worker.health().processed}", flush=True)
        return 0
    finally:
        await queue.close()
        await client.aclose()


def watchdog(seconds: float) -> None:
    def expire() -> None:
        time.sleep(seconds)
        print("error: gave up (max seconds)", flush=True)
        os._exit(3)

    threading.Thread(target=expire, daemon=True, name="watchdog").start()


def main() -> int:
    args = parse()
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(name)s %(message)s"
    )
    watchdog(args.max_seconds)
    if args.kind == "thread":
        return run_thread(args)
    return asyncio.run(run_async(args))


if __name__ == "__main__":
    sys.exit(main())
