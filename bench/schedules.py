"""Recurring schedules under load (issue #19's bars): ``python -m bench.schedules``.

```console
$ .venv/bin/python -m bench.schedules many --seconds 600    # 10,000 schedules, two workers
$ .venv/bin/python -m bench.schedules kill --seconds 600    # a 1-s schedule, a kill every 30 s
$ .venv/bin/python -m bench.schedules many --schedules 500 --seconds 20   # a quick look
```

Both start a private ``redis-server`` (the one on PATH) on a free port of 127.0.0.1 and stop
only the processes they started.

``many``
    ``--schedules`` schedules (default 10,000) on one queue, schedule ``i`` every
    ``1 + i % 60`` seconds, their phases spread over the period (``--aligned``: all at phase
    0, as ``every=`` is by default, so that each whole minute fires all 10,000 at once), run
    by two worker processes (``poll_many(200)`` + ``ack_many``). Each
    worker records every fire it is handed: schedule, nominal ms, server delivery ms,
    attempts. Reported: fires, lateness (server delivery time minus nominal time)
    p50/p99/max, fires delivered twice as first deliveries (must be 0), times missing in the
    measured window (each schedule's times from the window's start to its end minus a
    period, must be 0), the schedules' own skipped/missed counters, Redis CPU per fire, and
    Redis commands/s both during the run and idle (afterwards, with one 60-s schedule left and
    the two workers waiting).
``kill``
    one 1-s schedule (``overlap="allow_all"``, 2 s leases), three worker processes; every
    ``--kill-every`` seconds (30) one of them is SIGKILLed and a new one started. At the end
    the schedule is paused and its remaining fires drained (a killed worker's fire comes back
    when its lease runs out). Reported: duplicates (a time delivered twice as a first
    delivery) and missing times (must both be 0).

Lateness and commands are measured on a shared machine unless you say otherwise: print the
load next to the figure (``os.getloadavg()`` is included in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parent.parent


# -- the worker process ------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> int:
    """Take and ack fires until SIGTERM (or SIGKILL); each one written to ``args.out``."""
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    queue = DelayQueue(
        args.queue, args.url, prefix=args.prefix, visibility_timeout=args.lease,
        reconnect_timeout=5, fetch_ahead=0,
    )  # fmt: skip
    with open(args.out, "a", buffering=1) as out:
        print("ready", flush=True)
        while not stop:
            tasks = queue.poll_many(200, timeout=0.5)
            for task in tasks:
                assert task.fire_time is not None
                nominal = round(task.fire_time.timestamp() * 1000)
                out.write(f"{task.schedule} {nominal} {task.delivered_ms} {task.attempts}\n")
            if tasks:
                queue.ack_many(tasks)
    queue.close()
    return 0


class Worker:
    def __init__(self, url: str, prefix: str, queue: str, out: Path, lease: float) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.schedules", "_worker", url, prefix, queue, str(out),
             "--lease", str(lease)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().decode()
        if not line.startswith("ready"):
            raise RuntimeError(f"worker did not start: {line}{self.popen.stdout.read().decode()}")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def records(folder: Path) -> list[tuple[str, int, int, int]]:
    rows = []
    for path in folder.glob("w*.log"):
        for line in path.read_text().splitlines():
            name, nominal, delivered, attempts = line.split()
            rows.append((name, int(nominal), int(delivered), int(attempts)))
    return rows


def pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def idle_rate(client: redis.Redis, settle: float = 3.0, window: float = 20.0) -> float:
    """Redis commands/s (those run inside scripts included) over ``window`` seconds."""
    time.sleep(settle)
    before, _ = redis_counters(client)
    time.sleep(window)
    after, _ = redis_counters(client)
    return round((after - before - 2) / window, 2)  # less this function's own INFO calls


def redis_counters(client: redis.Redis) -> tuple[float, float]:
    stats, cpu = client.info("stats"), client.info("cpu")
    return float(stats["total_commands_processed"]), float(cpu["used_cpu_sys"]) + float(
        cpu["used_cpu_user"]
    )


# -- many ----------------------------------------------------------------------------------------


def phase_ms(i: int, every_ms: int, aligned: bool) -> int:
    """Schedule ``i``'s phase: 0 (every one of a period fires at once) or spread over it."""
    return 0 if aligned else (i * 7919) % every_ms


def run_many(url: str, count: int, seconds: float, folder: Path, aligned: bool) -> dict[str, Any]:
    prefix, queue_name = f"bench-sched-{uuid.uuid4().hex[:6]}", "many"
    client = redis.Redis.from_url(url)
    q = DelayQueue(queue_name, url, prefix=prefix)
    # The workers first: a schedule upserted with no consumer running would count the times
    # that pass before one starts as missed (catch-up).
    workers = [Worker(url, prefix, queue_name, folder / f"w{k}.log", 30) for k in range(2)]
    plain_idle = idle_rate(client)  # the two workers on the queue before any schedule
    started = time.time()
    for i in range(count):
        every_ms = (1 + i % 60) * 1000
        q.schedules.upsert(
            f"s{i}",
            i,
            every=timedelta(milliseconds=every_ms),
            phase=timedelta(milliseconds=phase_ms(i, every_ms, aligned)),
        )
    upsert_s = time.time() - started
    window_start_ms = int(time.time() * 1000) + 1000
    commands_0, cpu_0 = redis_counters(client)
    time.sleep(seconds)
    commands_1, cpu_1 = redis_counters(client)
    window_end_ms = int(time.time() * 1000)
    time.sleep(10)  # the window's last fires are handed out before the schedules go
    infos = q.schedules.list(upcoming=0)
    skipped = sum(i.skipped for i in infos)
    missed = sum(i.missed for i in infos)
    skipped_names = [i.name for i in infos if i.skipped][:5]
    kept = min(59, count - 1)  # the idle phase: one schedule left, every 60 s if there are 60
    for i in range(count):
        if i != kept:
            q.schedules.remove(f"s{i}")
    sched_idle = idle_rate(client)
    for w in workers:
        w.stop()
    rows = records(folder)
    firsts = Counter((name, nominal) for name, nominal, _, attempts in rows if attempts == 1)
    twice = sum(1 for n in firsts.values() if n > 1)
    lateness = [
        delivered - nominal
        for name, nominal, delivered, attempts in rows
        if attempts == 1 and window_start_ms <= nominal <= window_end_ms
    ]
    missing, examples = 0, []
    for i in range(count):
        every_ms = (1 + i % 60) * 1000
        phase = phase_ms(i, every_ms, aligned)
        first = phase + ((window_start_ms - phase) // every_ms + 1) * every_ms
        for t in range(first, window_end_ms, every_ms):
            if (f"s{i}", t) not in firsts:
                missing += 1
                if len(examples) < 5:
                    examples.append(f"s{i}@{t}")
    fires = len(lateness)
    q.close()
    client.close()
    return {
        "scenario": "many",
        "schedules": count,
        "phases": "aligned" if aligned else "spread",
        "seconds": seconds,
        "upsert_s": round(upsert_s, 1),
        "fires_in_window": fires,
        "fires_per_s": round(fires / seconds, 1),
        "lateness_ms": {
            "p50": pct(lateness, 0.5),
            "p90": pct(lateness, 0.9),
            "p99": pct(lateness, 0.99),
            "p999": pct(lateness, 0.999),
            "max": max(lateness) if lateness else None,
        },
        "delivered_twice": twice,
        "missing": missing,
        "window_ms": [window_start_ms, window_end_ms],
        "missing_examples": examples,
        "schedule_skipped": skipped,
        "schedule_missed": missed,
        "skipped_examples": skipped_names,
        "redis_cpu_us_per_fire": round((cpu_1 - cpu_0) / max(fires, 1) * 1e6, 1),
        "redis_commands_per_s_running": round((commands_1 - commands_0) / seconds, 1),
        "redis_commands_per_s_idle_one_schedule": sched_idle,
        "redis_commands_per_s_idle_no_schedule": plain_idle,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


# -- kill -----------------------------------------------------------------------------------------


def run_kill(url: str, seconds: float, kill_every: float, folder: Path) -> dict[str, Any]:
    prefix, queue_name = f"bench-kill-{uuid.uuid4().hex[:6]}", "kill"
    q = DelayQueue(queue_name, url, prefix=prefix)
    q.schedules.upsert("beat", "b", every=1, overlap="allow_all")
    made = 0

    def new_worker() -> Worker:
        nonlocal made
        made += 1
        return Worker(url, prefix, queue_name, folder / f"w{made}.log", 2)

    workers = [new_worker() for _ in range(3)]
    kills = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(kill_every, max(0.0, deadline - time.monotonic())))
        if time.monotonic() >= deadline:
            break
        workers.pop(kills % len(workers)).kill()
        kills += 1
        workers.append(new_worker())
    q.schedules.pause("beat")
    time.sleep(4)  # the killed workers' leases (2 s) run out; the live workers drain them
    for w in workers:
        w.stop()
    rows = records(folder)
    firsts = Counter(nominal for _, nominal, _, attempts in rows if attempts == 1)
    info = q.schedules.get("beat")
    assert info is not None and info.last_fire is not None
    last = round(info.last_fire.timestamp() * 1000)
    expected = set(range(min(firsts), last + 1, 1000))
    left = q.stats().total
    q.close()
    return {
        "scenario": "kill",
        "seconds": seconds,
        "kills": kills,
        "times": len(expected),
        "delivered": len(firsts),
        "duplicates": sum(1 for n in firsts.values() if n > 1),
        "missing": len(expected - set(firsts)),
        "redelivered_after_a_kill": sum(1 for *_, attempts in rows if attempts > 1),
        "tasks_left": left,
        "schedule_missed": info.missed,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.schedules")
    sub = parser.add_subparsers(dest="command", required=True)
    many = sub.add_parser("many", help="many schedules, two workers")
    many.add_argument("--schedules", type=int, default=10_000)
    many.add_argument("--seconds", type=float, default=600)
    many.add_argument(
        "--aligned", action="store_true", help="every schedule of a period fires at once"
    )
    kill = sub.add_parser("kill", help="a 1-s schedule, a worker killed every 30 s")
    kill.add_argument("--seconds", type=float, default=600)
    kill.add_argument("--kill-every", type=float, default=30)
    worker = sub.add_parser("_worker")
    for arg in ("url", "prefix", "queue", "out"):
        worker.add_argument(arg)
    worker.add_argument("--lease", type=float, default=30)
    args = parser.parse_args(argv)
    if args.command == "_worker":
        return worker_main(args)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    with EmbeddedRedis(binary) as server, tempfile.TemporaryDirectory() as tmp:
        if args.command == "many":
            result = run_many(server.url, args.schedules, args.seconds, Path(tmp), args.aligned)
        else:
            result = run_kill(server.url, args.seconds, args.kill_every, Path(tmp))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
