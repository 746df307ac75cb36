"""A delayq worker for the failover scenarios, run as a separate process.

Usage: ``python ha_worker.py TARGET PREFIX QUEUES LEDGER_URL [--kind thread|async]
[--concurrency N] [--visibility S] [--sleep S] [--safety S] [--max-seconds S]``

``TARGET`` is read by ha_client.py; ``QUEUES`` is a comma-separated list of queue names, one
worker each in this process. The handler sleeps ``--sleep`` seconds and then records one JSON
line ``{"id", "queue", "attempts", "lateness_ms", "pid", "start_ms", "end_ms"}`` in the list
``PREFIX:handled`` of the ledger Redis at ``LEDGER_URL`` (which does not fail over); returning
acks the task. Handler runs of one task that overlap in time mean two consumers held its lease
at once.

It prints ``ready <pid>`` once every queue's listener is subscribed and runs until SIGTERM
(then prints ``stopped <processed>``); a watchdog ends it with exit code 3 after
``--max-seconds``. Logs go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aredis
from ha_client import close_client, make_client

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, Worker


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("prefix")
    parser.add_argument("queues")
    parser.add_argument("ledger_url")
    parser.add_argument("--kind", choices=["thread", "async"], default="thread")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--visibility", type=float, default=5.0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--safety", type=float, default=0.5, help="the queue's safety_interval")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    return parser.parse_args()


def queue_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "prefix": args.prefix,
        "visibility_timeout": args.visibility,
        "retry_backoff": Backoff(base=0.2, max=0.2, jitter=0.0),
        "safety_interval": args.safety,
        "reconnect_timeout": 2.0,
    }


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def record(task: Any, queue: str, started_ms: int) -> str:
    return json.dumps(
        {
            "id": task.id,
            "queue": queue,
            "attempts": task.attempts,
            "lateness_ms": task.lateness_ms,
            "pid": os.getpid(),
            "start_ms": started_ms,
            "end_ms": now_ms(),
        }
    )


def run_thread(args: argparse.Namespace) -> int:
    ledger = redis.Redis.from_url(args.ledger_url)
    handled = f"{args.prefix}:handled"
    client = make_client(args.target)
    queues = [DelayQueue(n, client, **queue_options(args)) for n in args.queues.split(",")]

    def handler_for(name: str) -> Any:
        def handler(task: Any) -> None:
            started_ms = now_ms()
            if args.sleep:
                time.sleep(args.sleep)
            ledger.rpush(handled, record(task, name, started_ms))

        return handler

    try:
        for queue in queues:
            queue.poll(timeout=0)  # starts the listener (nothing is due yet)
        workers = [
            Worker(q, handler_for(q.name), concurrency=args.concurrency, handle_signals=False)
            for q in queues
        ]
        print(f"ready {os.getpid()}", flush=True)
        threads = [threading.Thread(target=w.run, name=f"run:{w}") for w in workers]
        for t in threads:
            t.start()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
        for w in workers:
            w.stop()
        for t in threads:
            t.join(30)
        print(f"stopped {sum(w.health().processed for w in workers)}", flush=True)
        return 0
    finally:
        for queue in queues:
            queue.close()
        close_client(client)
        ledger.close()


async def run_async(args: argparse.Namespace) -> int:
    ledger = aredis.Redis.from_url(args.ledger_url)
    handled = f"{args.prefix}:handled"
    client = make_client(args.target, asyncio=True)
    queues = [AsyncDelayQueue(n, client, **queue_options(args)) for n in args.queues.split(",")]

    def handler_for(name: str) -> Any:
        async def handler(task: Any) -> None:
            started_ms = now_ms()
            if args.sleep:
                await asyncio.sleep(args.sleep)
            await ledger.rpush(handled, record(task, name, started_ms))

        return handler

    try:
        for queue in queues:
            await queue.poll(timeout=0)
        workers = [
            AsyncWorker(q, handler_for(q.name), concurrency=args.concurrency, handle_signals=False)
            for q in queues
        ]
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: [w.stop() for w in workers])
        print(f"ready {os.getpid()}", flush=True)
        await asyncio.gather(*(w.run() for w in workers))
        print(f"stopped {sum(w.health().processed for w in workers)}", flush=True)
        return 0
    finally:
        for queue in queues:
            await queue.close()
        if not isinstance(client, str):
            await client.aclose()
        await ledger.aclose()


def watchdog(seconds: float) -> None:
    def expire() -> None:
        time.sleep(seconds)
        print("error: gave up (max seconds)", flush=True)
        os._exit(3)

    threading.Thread(target=expire, daemon=True, name="watchdog").start()


def main() -> int:
    args = parse()
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    watchdog(args.max_seconds)
    if args.kind == "thread":
        return run_thread(args)
    return asyncio.run(run_async(args))


if __name__ == "__main__":
    sys.exit(main())
