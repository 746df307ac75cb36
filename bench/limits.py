"""Flow control under load (issue #20): ``python -m bench.limits``.

```console
$ .venv/bin/python -m bench.limits            # ~2 min: 60 s at 1,000/s, then the key mix
$ .venv/bin/python -m bench.limits --quick    # 5 s at 200/s, 1,000 + 20 tasks
```

A private redis-server (the one on PATH, a free port of 127.0.0.1) and 4 worker processes
(the thread ``Worker``, concurrency 8, no-op handlers; each keeps its hand-out times in
memory and writes them to Redis once, when stopped):

``rate``
    a whole-queue limit of 1,000/s (burst 50) over 60 s: 60,000 tasks offered ahead, due at
    once. Reported: the achieved rate ((tasks - burst) / span of hand-outs), the most
    hand-outs in any second (sliding, on the server's clock; bar: rate + burst), and Redis
    commands per task (script calls, and every command including those inside scripts,
    from INFO commandstats) beside an unthrottled run of the same tasks.
``keys``
    10,000 tasks of one key at concurrency 1, offered first, then 100 tasks of 100 other
    keys: the time from the workers' start until every other key's task is handled (bar: 2 s).
``fair``
    no limits: 10,000 tasks of one key due first, then 20 of another; where in the hand-outs
    the other key's last task came (fairness across keys), and when.

The machine may be shared: the figures say what this run measured, nothing more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import redis

from delayq import DelayQueue, Limit, Offer, Worker
from delayq.embedded import EmbeddedRedis, find_redis_server

WORKERS = 4


# -- the worker process ---------------------------------------------------------------------


def worker_main(url: str, prefix: str, queue: str) -> None:
    starts: list[tuple[int, Any]] = []

    def handler(task: Any) -> None:
        starts.append((task.delivered_ms, task.payload))

    with DelayQueue(queue, url, prefix=prefix, safety_interval=5) as q:
        worker = Worker(q, handler, concurrency=8, handle_signals=True)
        print("ready", flush=True)
        worker.run()
    client = redis.Redis.from_url(url)
    if starts:
        client.rpush(f"{prefix}:starts", *(json.dumps(s) for s in starts))
    client.close()


class Pool:
    def __init__(self, url: str, prefix: str, queue: str) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.limits", "--worker", url, prefix, queue],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(WORKERS)
        ]
        for proc in self.procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready")

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(60)
            if proc.stdout is not None:
                proc.stdout.close()


def commands(client: redis.Redis) -> tuple[int, int]:
    """(script calls, every command) so far, from INFO commandstats."""
    stats = client.info("commandstats")
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha",))
    return scripts, sum(int(v["calls"]) for v in stats.values())


def handled(client: redis.Redis, prefix: str) -> list[tuple[int, Any]]:
    return [tuple(json.loads(raw)) for raw in client.lrange(f"{prefix}:starts", 0, -1)]


def most_in_a_second(times: list[int]) -> int:
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - 1000:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# -- scenarios ------------------------------------------------------------------------------


def run_drain(url: str, n: int, limit: Limit | None) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    prefix = f"bench-lim-{uuid.uuid4().hex[:8]}"
    with DelayQueue("rate", url, prefix=prefix) as q:
        if limit is not None:
            q.limits.set("*", limit)
        pool = Pool(url, prefix, "rate")
        due_at = time.time() + 3 + n / 100_000
        for start in range(0, n, 5000):
            q.offer_many([Offer(i, at=due_at) for i in range(start, min(n, start + 5000))])
        before = commands(client)
        while q.stats().total > 0:  # once a second: this look's own commands stay few
            time.sleep(1.0)
        after = commands(client)
        pool.stop()
    rows = handled(client, prefix)
    client.close()
    times = [t for t, _ in rows]
    payloads = sorted(p for _, p in rows)
    span = (max(times) - min(times)) / 1000
    burst = limit.burst or 1 if limit is not None else 0
    return {
        "tasks": n,
        "lost": n - len(set(payloads)),
        "twice": len(payloads) - len(set(payloads)),
        "span_s": round(span, 3),
        "achieved_per_s": round((n - burst) / span, 1) if span else None,
        "most_in_a_second": most_in_a_second(times),
        "script_calls_per_task": round((after[0] - before[0]) / n, 3),
        "commands_per_task": round((after[1] - before[1]) / n, 3),
    }


def run_keys(url: str, big: int, others: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    prefix = f"bench-keys-{uuid.uuid4().hex[:8]}"
    with DelayQueue("keys", url, prefix=prefix) as q:
        q.limits.set("big", Limit(concurrency=1))
        q.offer_many([Offer(("big", i), 0, limit_key="big") for i in range(big)])
        other_ids = q.offer_many([Offer(("other", i), 0, limit_key=f"k{i}") for i in range(others)])
        started = time.monotonic()
        pool = Pool(url, prefix, "keys")
        done_s = None
        while time.monotonic() - started < 120:
            if all(q.get(task_id) is None for task_id in other_ids):  # handled and acked
                done_s = time.monotonic() - started
                break
            time.sleep(0.05)
        big_waiting = q.limits.get("big").waiting
        pool.stop()
    rows = handled(client, prefix)
    client.close()
    other_times = [t for t, p in rows if p[0] == "other"]
    first = min(t for t, _ in rows)
    return {
        "big_tasks": big,
        "other_tasks": others,
        # from the first hand-out (the workers starting) to the last other key's, server clock
        "others_last_hand_out_s": round((max(other_times) - first) / 1000, 3),
        # from starting the worker processes until all others were acked (this host's clock,
        # includes the processes' start-up)
        "others_done_from_spawn_s": None if done_s is None else round(done_s, 2),
        "big_handled_until_stop": sum(1 for _, p in rows if p[0] == "big"),
        "big_still_waiting_at_stop": big_waiting,
    }


def run_fair(url: str, big: int, small: int) -> dict[str, Any]:
    """No limits, only keys: one key's backlog due first, another's few tasks behind it."""
    client = redis.Redis.from_url(url)
    prefix = f"bench-fair-{uuid.uuid4().hex[:8]}"
    with DelayQueue("fair", url, prefix=prefix) as q:
        q.offer_many([Offer(("big", i), 0, limit_key="big") for i in range(big)])
        q.offer_many([Offer(("small", i), 0, limit_key="small") for i in range(small)])
        pool = Pool(url, prefix, "fair")
        while q.stats().total > 0:
            time.sleep(0.05)
        pool.stop()
    rows = sorted(handled(client, prefix))
    client.close()
    first = rows[0][0]
    small_at = [i for i, (_, p) in enumerate(rows) if p[0] == "small"]
    return {
        "big_tasks": big,
        "small_tasks": small,
        "lost": big + small - len({tuple(p) for _, p in rows}),
        # hand-outs (of both keys) before the small key's last task, and when it was handed out
        "hand_outs_before_last_small": small_at[-1] if small_at else None,
        "last_small_hand_out_s": round((rows[small_at[-1]][0] - first) / 1000, 3),
        "all_handed_out_s": round((rows[-1][0] - first) / 1000, 3),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(*sys.argv[2:5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rate, seconds = (200, 5) if args.quick else (1000, 60)
    big, others = (1000, 20) if args.quick else (10_000, 100)
    load = os.getloadavg()
    results: dict[str, Any] = {"machine_load_1m_at_start": round(load[0], 2)}
    with EmbeddedRedis(find_redis_server()) as server:
        n = rate * seconds
        results["unthrottled"] = run_drain(server.url, n, None)
        results["rate"] = run_drain(server.url, n, Limit(rate=rate, burst=50))
        results["keys"] = run_keys(server.url, big, others)
        results["fair"] = run_fair(server.url, big, 20)
    results["machine_load_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench.limits"
    sys.exit(main())
