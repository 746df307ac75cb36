"""Worker runtime benchmarks against the bars of the worker issue: ``python -m bench.worker``.

```console
$ .venv/bin/python -m bench.worker                 # full sizes (100,000-task drains)
$ .venv/bin/python -m bench.worker --quick         # tiny sizes: checks the harness in seconds
$ .venv/bin/python -m bench.worker --json          # also writes bench/results/worker.json
$ .venv/bin/python -m bench.worker --concurrency-sweep   # drain rates for several concurrencies
```

Every scenario runs against one private redis-server (the one on PATH, started here on a free
port) unless ``--redis URL`` names a scratch server, **whose database is flushed between
scenarios**. Workers run in their own processes (``multiprocessing`` spawn), as in production.

Scenarios (bars from the issue in brackets):

``drain_async``
    100,000 tasks due now; one process runs one ``AsyncWorker`` with a no-op ``async def``
    handler, acks on, concurrency ``--async-concurrency`` (default 64, prefetch = concurrency).
    Reports tasks/s, lost, duplicated. [>= 15,000 tasks/s]
``drain_thread``
    The same with one thread ``Worker`` and a no-op handler, ``--thread-concurrency`` threads
    (default 16). [>= 8,000 tasks/s]
``four_processes``
    20,000 tasks due now, four worker processes (2 ``AsyncWorker`` + 2 ``Worker``, concurrency
    16 each) on one queue, SIGTERM at the end. Reports each process's share, lost, duplicated.
    [no task delivered twice]
``sigterm_100_async`` / ``sigterm_100_thread``
    A worker process with concurrency 50 and prefetch 50 holds 100 of 500 tasks (handlers of
    0.5 s, visibility timeout 60 s, grace 5 s) and gets SIGTERM; a fresh worker then drains the
    rest. Reports seconds to exit, tasks still leased after the exit, lost, duplicated, and how
    long the rest took (far below 60 s unless a task waited for its lease). [none lost, none
    left waiting for its visibility timeout]

The drain rate is the number of tasks over the time from ``run()`` starting to ``run()``
returning once the handler saw the last task (its final acks are flushed by then); the queue's
own counters are then checked (``delivered == acked == n``). "duplicated" counts handler calls
beyond one per task, "lost" tasks never handled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import threading
import time
from pathlib import Path
from typing import Any

import redis

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Worker
from delayq.embedded import EmbeddedRedis

RESULTS = Path(__file__).parent / "results"
PAYLOAD = {"order_id": 123456, "user": "someone@example.com"}


# -- the worker process ----------------------------------------------------------------------


def _worker_process(
    kind: str,
    url: str,
    name: str,
    options: dict[str, Any],
    stop_after: int | None,
    sleep: float,
    visibility: float,
    out: Any,
    ready: Any,
) -> None:
    """Run one worker until it has handled ``stop_after`` tasks or 90 s passed (or, with
    None, until SIGTERM); put ``(pid, ids handled, seconds run() took)`` on ``out``."""
    seen: list[str] = []
    # This process is the program: SIGTERM stops its worker gracefully (workers embedded in
    # an application leave the signals alone unless asked).
    options = {"handle_signals": True, **options}
    args = (url, name, options, stop_after, sleep, visibility, seen, ready)
    took = asyncio.run(_run_async(*args)) if kind == "async" else _run_thread(*args)
    out.put((os.getpid(), seen, took))


async def _run_async(
    url: str,
    name: str,
    options: dict[str, Any],
    stop_after: int | None,
    sleep: float,
    visibility: float,
    seen: list[str],
    ready: Any,
) -> float:
    queue = AsyncDelayQueue(name, url, visibility_timeout=visibility)

    async def handler(task: Any) -> None:
        seen.append(task.id)
        if sleep:
            await asyncio.sleep(sleep)

    worker = AsyncWorker(queue, handler, **options)

    async def watch() -> None:
        give_up = time.monotonic() + 90
        while len(seen) < (stop_after or 0) and time.monotonic() < give_up:
            await asyncio.sleep(0.002)
        worker.stop()

    watcher = asyncio.create_task(watch()) if stop_after else None
    ready.set()
    start = time.perf_counter()
    await worker.run()
    took = time.perf_counter() - start
    if watcher is not None:
        watcher.cancel()
    await queue.close()
    return took


def _run_thread(
    url: str,
    name: str,
    options: dict[str, Any],
    stop_after: int | None,
    sleep: float,
    visibility: float,
    seen: list[str],
    ready: Any,
) -> float:
    queue = DelayQueue(name, url, visibility_timeout=visibility)
    lock = threading.Lock()

    def handler(task: Any) -> None:
        with lock:
            seen.append(task.id)
        if sleep:
            time.sleep(sleep)

    worker = Worker(queue, handler, **options)

    def watch() -> None:
        give_up = time.monotonic() + 90
        while len(seen) < (stop_after or 0) and time.monotonic() < give_up:
            time.sleep(0.002)
        worker.stop()

    if stop_after:
        threading.Thread(target=watch, daemon=True).start()
    ready.set()
    start = time.perf_counter()
    worker.run()
    took = time.perf_counter() - start
    queue.close()
    return took


def _spawn(ctx: Any, kind: str, url: str, name: str, out: Any, **kwargs: Any) -> Any:
    """Start a worker process and return once it is about to call ``run()``."""
    ready = ctx.Event()
    args = (
        kind,
        url,
        name,
        kwargs["options"],
        kwargs.get("stop_after"),
        kwargs.get("sleep", 0.0),
        kwargs.get("visibility", 30.0),
        out,
        ready,
    )
    proc = ctx.Process(target=_worker_process, args=args, daemon=True)
    proc.start()
    if not ready.wait(60):
        raise RuntimeError(f"worker process {proc.pid} did not start")
    return proc


def _offer(url: str, name: str, n: int) -> list[str]:
    ids: list[str] = []
    with DelayQueue(name, url) as q:
        for first in range(0, n, 10_000):
            ids += q.offer_many([(PAYLOAD, 0) for _ in range(first, min(first + 10_000, n))])
    return ids


def _stats(url: str, name: str) -> Any:
    with DelayQueue(name, url) as q:
        return q.stats()


def _verdict(ids: list[str], handled: list[str]) -> dict[str, int]:
    unique = set(handled)
    return {"lost": len(set(ids) - unique), "duplicated": len(handled) - len(unique)}


# -- scenarios -------------------------------------------------------------------------------


def bench_drain(url: str, kind: str, n: int, concurrency: int) -> dict[str, Any]:
    name = f"bench-drain-{kind}"
    ids = _offer(url, name, n)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    options = {"concurrency": concurrency, "handle_signals": False}
    proc = _spawn(ctx, kind, url, name, out, options=options, stop_after=n)
    _, seen, took = out.get(timeout=600)
    proc.join(30)
    stats = _stats(url, name)
    counters = stats.counters
    return {
        "tasks": n,
        "concurrency": concurrency,
        "per_s": round(n / took),
        "seconds": round(took, 2),
        **_verdict(ids, seen),
        "delivered": counters.get("delivered", 0),
        "acked": counters.get("acked", 0),
        "left": stats.ready + stats.inflight + stats.delayed,
    }


def bench_four_processes(url: str, n: int, concurrency: int) -> dict[str, Any]:
    name = "bench-four"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    options = {"concurrency": concurrency}
    kinds = ["async", "thread", "async", "thread"]
    procs = [_spawn(ctx, kind, url, name, out, options=options) for kind in kinds]
    start = time.perf_counter()
    ids = _offer(url, name, n)
    deadline = time.monotonic() + 300
    while _stats(url, name).counters.get("acked", 0) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    took = time.perf_counter() - start
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
    handled = [task_id for _, seen, _ in results for task_id in seen]
    counters = _stats(url, name).counters
    return {
        "tasks": n,
        "processes": "2 async + 2 thread",
        "concurrency": concurrency,
        "per_s": round(n / took),
        "shares": sorted((len(seen) for _, seen, _ in results), reverse=True),
        **_verdict(ids, handled),
        "delivered": counters.get("delivered", 0),
        "acked": counters.get("acked", 0),
    }


def bench_sigterm(url: str, kind: str, n: int) -> dict[str, Any]:
    """SIGTERM to a worker holding 100 tasks (50 running, 50 prefetched)."""
    name = f"bench-sigterm-{kind}"
    ids = _offer(url, name, n)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    options = {"concurrency": 50, "prefetch": 50, "grace": 5.0}
    proc = _spawn(ctx, kind, url, name, out, options=options, sleep=0.5, visibility=60.0)
    deadline = time.monotonic() + 30
    while _stats(url, name).inflight < 100 and time.monotonic() < deadline:
        time.sleep(0.005)
    held = _stats(url, name).inflight
    signalled = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM)
    _, first, _ = out.get(timeout=60)
    proc.join(30)
    exit_s = time.perf_counter() - signalled
    after = _stats(url, name)

    # A fresh no-op worker takes the rest: fast, unless tasks wait for their 60 s lease.
    rest = n - len(set(first))
    start = time.perf_counter()
    options = {"concurrency": 50, "handle_signals": False}
    drainer = _spawn(ctx, kind, url, name, out, options=options, stop_after=rest, visibility=60)
    _, second, _ = out.get(timeout=120)
    drainer.join(30)
    rest_s = time.perf_counter() - start
    final = _stats(url, name)
    return {
        "tasks": n,
        "held_at_signal": held,
        "exit_s": round(exit_s, 2),
        "left_leased_after_exit": after.inflight,
        "finished_in_grace": len(first),
        "handed_back": after.ready - (n - held),
        **_verdict(ids, first + second),
        "rest_drained_s": round(rest_s, 2),
        "left_at_end": final.ready + final.inflight + final.delayed,
    }


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis", help="Redis URL of a scratch server: its database is FLUSHED between scenarios"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--json", action="store_true", help="write bench/results/worker.json")
    parser.add_argument("--async-concurrency", type=int, default=64)
    parser.add_argument("--thread-concurrency", type=int, default=16)
    parser.add_argument(
        "--concurrency-sweep", action="store_true", help="only the drains, several concurrencies"
    )
    args = parser.parse_args(argv)
    n = 5_000 if args.quick else 100_000
    server = None if args.redis else EmbeddedRedis().start()
    url = args.redis or server.url  # type: ignore[union-attr]
    try:
        flush = redis.Redis.from_url(url)
        results: dict[str, Any] = {
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "redis": flush.info("server")["redis_version"],
            },
        }
        print(f"machine: {results['machine']}", flush=True)
        if args.concurrency_sweep:
            steps = [
                (f"drain_{kind}_c{c}", lambda kind=kind, c=c: bench_drain(url, kind, n, c))
                for kind, sweep in (("async", (16, 32, 64, 128, 256)), ("thread", (4, 8, 16, 32)))
                for c in sweep
            ]
        else:
            steps = [
                ("drain_async", lambda: bench_drain(url, "async", n, args.async_concurrency)),
                ("drain_thread", lambda: bench_drain(url, "thread", n, args.thread_concurrency)),
                ("four_processes", lambda: bench_four_processes(url, n // 5, 16)),
                ("sigterm_100_async", lambda: bench_sigterm(url, "async", 500)),
                ("sigterm_100_thread", lambda: bench_sigterm(url, "thread", 500)),
            ]
        for name, step in steps:
            flush.flushdb()
            results[name] = step()
            print(f"{name:>20}: {results[name]}", flush=True)
        flush.flushdb()
        flush.close()
    finally:
        if server is not None:
            server.stop()
    if args.json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "worker.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
