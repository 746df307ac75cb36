"""A producer for the failover scenarios, run as a separate process.

Usage: ``python ha_producer.py TARGET PREFIX QUEUES LEDGER_URL [--count N] [--rate R]
[--delay S] [--first N] [--max-seconds S] [--durable REPLICAS]``

``TARGET`` is read by ha_client.py; ``QUEUES`` is a comma-separated list of queue names
(task ``i`` goes to ``QUEUES[i % len]``). Task ``i`` gets the caller id ``p<i>`` and the
payload ``{"i": i}``, due ``--delay`` seconds after its offer. An offer that raises is retried
with the same id until it returns (a caller id makes the retry a no-op if the first one took);
with ``--durable``, until it returns without ``NotDurable`` too.

Everything is recorded in the ledger Redis at ``LEDGER_URL`` (which does not fail over):

* ``PREFIX:offered``: one JSON line ``{"id", "queue", "at_ms"}`` per offer that returned;
* ``PREFIX:errors``: one JSON line ``{"id", "at_ms", "error", "message"}`` per failed try.

It prints ``ready <pid>`` before its first offer, ``done <count>`` at the end and exits 0;
after ``--max-seconds`` it gives up with exit code 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis
from ha_client import close_client, make_client

from delayq import DelayQueue, Durability


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("prefix")
    parser.add_argument("queues")
    parser.add_argument("ledger_url")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--first", type=int, default=0, help="number of the first task")
    parser.add_argument("--rate", type=float, default=100.0, help="offers per second")
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--reconnect-timeout", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=90.0)
    parser.add_argument(
        "--durable", type=int, default=0, help="replicas each offer waits for (0: none)"
    )
    args = parser.parse_args()
    durability = Durability(replicas=args.durable, timeout=1.0) if args.durable else None

    give_up = time.monotonic() + args.max_seconds
    ledger = redis.Redis.from_url(args.ledger_url)
    client = make_client(args.target)
    queues = [
        DelayQueue(
            name,
            client,
            prefix=args.prefix,
            reconnect_timeout=args.reconnect_timeout,
            durability=durability,
        )
        for name in args.queues.split(",")
    ]
    offered, errors = f"{args.prefix}:offered", f"{args.prefix}:errors"
    print(f"ready {os.getpid()}", flush=True)
    started = time.monotonic()
    try:
        for n in range(args.count):
            i = args.first + n
            task_id, queue = f"p{i:06d}", queues[i % len(queues)]
            pace = started + n / args.rate - time.monotonic()
            if pace > 0:
                time.sleep(pace)
            while True:
                if time.monotonic() > give_up:
                    print("error: gave up (max seconds)", flush=True)
                    return 3
                try:
                    queue.offer({"i": i}, delay=args.delay, id=task_id)
                    break
                except Exception as exc:  # every failure is recorded, then the same id again
                    record = {"id": task_id, "at_ms": now_ms(), "error": type(exc).__name__}
                    record["message"] = str(exc)[:300]
                    ledger.rpush(errors, json.dumps(record))
                    time.sleep(0.05)
            ledger.rpush(
                offered, json.dumps({"id": task_id, "queue": queue.name, "at_ms": now_ms()})
            )
        print(f"done {args.count}", flush=True)
        return 0
    finally:
        for queue in queues:
            queue.close()
        close_client(client)
        ledger.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


if __name__ == "__main__":
    sys.exit(main())
