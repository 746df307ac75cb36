"""A consumer process for the schedule tests: upserts a schedule at start (as every pod of a
service would), then takes and acks tasks, recording each fire's nominal ms.

Usage: ``python schedule_worker.py URL PREFIX QUEUE NAME EVERY_S [--max-seconds S]``

The schedule has ``overlap="allow_all"``, so every time fires whatever happened to the one
before (a fire held by a killed worker is delivered again when its 2 s lease runs out).
Prints ``ready <pid>`` after its upsert; pushes ``<fire ms>|<pid>|<attempts>`` to the Redis
list ``PREFIX:fires`` before each ack. A watchdog ends the process after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import redis

from delayq import DelayQueue


def main() -> int:
    parser = argparse.ArgumentParser()
    for arg in ("url", "prefix", "queue", "name"):
        parser.add_argument(arg)
    parser.add_argument("every", type=float)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    args = parser.parse_args()
    threading.Timer(args.max_seconds, lambda: os._exit(3)).start()
    client = redis.Redis.from_url(args.url)
    queue = DelayQueue(
        args.queue,
        args.url,
        prefix=args.prefix,
        safety_interval=0.5,
        reconnect_timeout=5,
        visibility_timeout=2,
    )
    queue.schedules.upsert(args.name, {"job": args.name}, every=args.every, overlap="allow_all")
    print(f"ready {os.getpid()}", flush=True)
    while True:
        task = queue.poll(timeout=1)
        if task is None:
            continue
        assert task.fire_time is not None
        ms = round(task.fire_time.timestamp() * 1000)
        client.rpush(f"{args.prefix}:fires", f"{ms}|{os.getpid()}|{task.attempts}")
        task.ack()
        time.sleep(0)


if __name__ == "__main__":
    raise SystemExit(main())
