"""A DelayQueue consumer run as a separate process by the multi-process tests.

Usage: ``python consumer.py URL PREFIX QUEUE MODE [--visibility S] [--backoff S]
[--batch N] [--max-seconds S] [--errors]``

It prints ``ready <pid>`` once its pub/sub listener is subscribed, then, by ``MODE``:

``drain``
    Takes tasks in batches, appends one JSON line per delivery to the Redis list
    ``PREFIX:delivered`` (id, attempts, lateness, pid and, with ``--errors``, the task's last
    error), acks them and counts lost leases in ``PREFIX:lease_lost``. Exits 0 once the key
    ``PREFIX:stop`` exists and no task is due.
``hold``
    Takes one task, prints ``leased <id> <attempts> <delivered_ms>`` and never acks it: it waits
    to be killed.

Every mode gives up after ``--max-seconds`` (exit 3) so a forgotten process cannot linger.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis

from delayq import Backoff, DelayQueue


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("queue")
    parser.add_argument("mode", choices=["drain", "hold"])
    parser.add_argument("--visibility", type=float, default=30.0)
    parser.add_argument("--backoff", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--errors", action="store_true", help="record each task's last error")
    args = parser.parse_args()

    give_up = time.monotonic() + args.max_seconds
    pid = os.getpid()
    client = redis.Redis.from_url(args.url)
    queue = DelayQueue(
        args.queue,
        args.url,
        prefix=args.prefix,
        visibility_timeout=args.visibility,
        retry_backoff=Backoff(base=args.backoff, max=args.backoff, jitter=0.0),
        safety_interval=0.5,
    )
    try:
        # A first poll starts the pub/sub listener; only then are we ready.
        first = queue.poll(timeout=0)
        if first is not None:
            print(f"error: a task was due before the consumer was ready: {first.id}", flush=True)
            return 2
        print(f"ready {pid}", flush=True)

        if args.mode == "hold":
            task = queue.poll(timeout=max(give_up - time.monotonic(), 0))
            if task is None:
                print("error: no task to hold", flush=True)
                return 2
            print(f"leased {task.id} {task.attempts} {task.delivered_ms}", flush=True)
            while time.monotonic() < give_up:  # hold the lease until SIGKILL
                time.sleep(0.1)
            return 3

        stop_key = f"{args.prefix}:stop"
        delivered_key = f"{args.prefix}:delivered"
        lost_key = f"{args.prefix}:lease_lost"
        while time.monotonic() < give_up:
            tasks = queue.poll_many(args.batch, timeout=0.2)
            if tasks:
                records = []
                for task in tasks:
                    info = queue.get(task.id) if args.errors else None
                    records.append(
                        json.dumps(
                            {
                                "id": task.id,
                                "attempts": task.attempts,
                                "delivered_ms": task.delivered_ms,
                                "lateness_ms": task.lateness_ms,
                                "pid": pid,
                                "error": info.last_error if info else None,
                            }
                        )
                    )
                client.rpush(delivered_key, *records)
                lost = queue.ack_many(tasks).count(False)
                if lost:
                    client.incrby(lost_key, lost)
            elif client.exists(stop_key):
                return 0
        print("error: gave up (max seconds)", flush=True)
        return 3
    finally:
        queue.close()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
