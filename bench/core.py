"""Core benchmarks of delayq against the bars of the core issue: ``python -m bench.core``.

Each scenario runs against one private redis-server (started here unless ``--redis`` is given)
and prints what it measured; ``--json`` also writes ``bench/results/core.json``. Lateness is
handler start minus due time, both read on this host (the server runs here too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import redis

from delayq import AsyncDelayQueue, DelayQueue
from delayq.embedded import EmbeddedRedis

RESULTS = Path(__file__).parent / "results"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def summary(lateness: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(pct(lateness, 0.50), 2),
        "p90_ms": round(pct(lateness, 0.90), 2),
        "p99_ms": round(pct(lateness, 0.99), 2),
        "max_ms": round(max(lateness, default=float("nan")), 2),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field median of repeated runs (counts of lost/duplicated/early: the maximum)."""
    merged: dict[str, Any] = {}
    for field in runs[0]:
        values = [run[field] for run in runs]
        if field in ("lost", "duplicated", "early"):
            merged[field] = max(values)
        elif isinstance(values[0], int | float):
            merged[field] = statistics.median(values)
        else:
            merged[field] = values[0]
    if len(runs) > 1:
        merged["runs"] = len(runs)
    return merged


# -- producing -------------------------------------------------------------------------------


def bench_offer(url: str, n: int, rounds: int) -> dict[str, Any]:
    """offer() one by one against a plain ZADD loop with the same client, interleaved."""
    client = redis.Redis.from_url(url)
    q = DelayQueue("bench-offer", client)
    payload = {"order_id": 123456, "user": "someone@example.com", "note": "x" * 40}
    offer_rates, zadd_rates = [], []
    for r in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            q.offer(payload, delay=600)
        offer_rates.append(n / (time.perf_counter() - start))
        body = json.dumps(payload)
        start = time.perf_counter()
        for i in range(n):
            client.zadd("bench-zadd", {f"{r}:{i}:{body}": 1e12 + i})
        zadd_rates.append(n / (time.perf_counter() - start))
    client.delete("bench-zadd")
    q.close()
    client.close()
    offer, zadd = statistics.median(offer_rates), statistics.median(zadd_rates)
    return {"offer_per_s": round(offer), "zadd_per_s": round(zadd), "ratio": round(offer / zadd, 3)}


def bench_offer_many(url: str, n: int) -> dict[str, Any]:
    q = DelayQueue("bench-offer-many", url)
    payload = {"order_id": 123456, "user": "someone@example.com", "note": "x" * 40}
    items = [(payload, 600 + i % 600) for i in range(n)]
    start = time.perf_counter()
    q.offer_many(items)
    elapsed = time.perf_counter() - start
    q.close()
    return {"tasks": n, "per_s": round(n / elapsed)}


def bench_memory(url: str, n: int) -> dict[str, Any]:
    """Redis used_memory per stored delayed task with a ~100-byte JSON payload."""
    client = redis.Redis.from_url(url)
    q = DelayQueue("bench-memory", client)
    payload = {"order_id": 1234567, "user": "customer-000001@example.com", "sku": "A" * 30}
    assert 90 <= len(json.dumps(payload, separators=(",", ":"))) <= 110
    before = int(client.info("memory")["used_memory"])
    q.offer_many([(payload, 3600 + random.random() * 3600) for _ in range(n)])
    after = int(client.info("memory")["used_memory"])
    q.close()
    client.close()
    return {"tasks": n, "bytes_per_task": round((after - before) / n)}


# -- consuming -------------------------------------------------------------------------------


def _consumer(url: str, name: str, expected: int, out: Any, ready: Any, stop: Any) -> None:
    q = DelayQueue(name, url)
    q.poll(timeout=0)  # subscribe before the producer starts
    ready.set()
    seen: list[tuple[str, float, int]] = []
    while not stop.is_set():
        task = q.poll(timeout=0.2)
        if task is None:
            continue
        started = time.time() * 1000
        seen.append((task.id, started - task.due_ms, task.delivered_ms - task.due_ms))
        task.ack()
    q.close()
    out.put(seen)


def bench_lateness(
    url: str, name: str, n: int, spread_s: float, lead_s: float, consumers: int
) -> dict[str, Any]:
    """n tasks due uniformly over spread_s (after lead_s), consumed by separate processes."""
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    readies = [ctx.Event() for _ in range(consumers)]
    procs = [
        ctx.Process(target=_consumer, args=(url, name, n, out, readies[i], stop))
        for i in range(consumers)
    ]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(30)
    q = DelayQueue(name, url)
    ids = q.offer_many([(i, lead_s + random.random() * spread_s) for i in range(n)])
    deadline = time.monotonic() + lead_s + spread_s + 30
    while time.monotonic() < deadline:
        s = q.stats()
        if s.delayed + s.ready + s.inflight == 0:
            break
        time.sleep(0.2)
    stop.set()
    seen = [row for _ in procs for row in out.get(timeout=30)]
    for p in procs:
        p.join(10)
    q.close()
    delivered = [row[0] for row in seen]
    lateness = [row[1] for row in seen]
    return {
        "tasks": n,
        "consumers": consumers,
        **summary(lateness),
        "early": sum(1 for row in seen if row[2] < 0),
        "lost": len(set(ids) - set(delivered)),
        "duplicated": len(delivered) - len(set(delivered)),
    }


def bench_drain(url: str, n: int, batch: int) -> dict[str, Any]:
    """n tasks due at once, drained by one sync consumer with batch fetch and batch ack."""
    q = DelayQueue("bench-drain", url)
    q.offer_many([(i, 0) for i in range(n)])
    seen: set[str] = set()
    dup = 0
    start = time.perf_counter()
    while len(seen) < n:
        tasks = q.poll_many(batch, timeout=1)
        if not tasks:
            break
        for t in tasks:
            dup += t.id in seen
            seen.add(t.id)
        q.ack_many(tasks)
    elapsed = time.perf_counter() - start
    q.close()
    return {
        "tasks": n,
        "per_s": round(len(seen) / elapsed),
        "lost": n - len(seen),
        "duplicated": dup,
    }


def bench_drain_async(url: str, n: int, batch: int, concurrency: int) -> dict[str, Any]:
    """The same drain with asyncio: several fetch/ack loops share one connection pool."""

    async def main() -> dict[str, Any]:
        q = AsyncDelayQueue("bench-drain-async", url)
        await q.offer_many([(i, 0) for i in range(n)])
        seen: set[str] = set()
        dup = 0

        async def loop() -> None:
            nonlocal dup
            while len(seen) < n:
                tasks = await q.poll_many(batch, timeout=0)
                if not tasks:
                    return
                for t in tasks:
                    dup += t.id in seen
                    seen.add(t.id)
                await q.ack_many(tasks)

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        await q.close()
        return {
            "tasks": n,
            "per_s": round(len(seen) / elapsed),
            "lost": n - len(seen),
            "duplicated": dup,
        }

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis", help="Redis URL of a scratch server: its database is FLUSHED between scenarios"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--json", action="store_true", help="write bench/results/core.json")
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario; medians shown")
    args = parser.parse_args(argv)
    scale = 0.02 if args.quick else 1.0
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
        steps = [
            ("offer_vs_zadd", lambda: bench_offer(url, int(5000 * scale) or 50, 3)),
            ("offer_many", lambda: bench_offer_many(url, int(100_000 * scale))),
            ("memory", lambda: bench_memory(url, int(100_000 * scale))),
            (
                "steady",
                lambda: bench_lateness(url, "bench-steady", int(2000 * scale), 10 * scale, 2, 2),
            ),
            (
                "sparse",
                lambda: bench_lateness(
                    url, "bench-sparse", max(int(40 * scale), 5), 10 * scale, 2, 1
                ),
            ),
            ("drain_sync", lambda: bench_drain(url, int(50_000 * scale), 500)),
            ("drain_async", lambda: bench_drain_async(url, int(50_000 * scale), 500, 4)),
        ]
        for name, step in steps:
            runs = []
            for _ in range(args.repeat):
                flush.flushdb()
                runs.append(step())
            results[name] = median_of(runs)
            print(f"{name:>14}: {results[name]}", flush=True)
        flush.flushdb()
        flush.close()
    finally:
        if server is not None:
            server.stop()
    if args.json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "core.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
