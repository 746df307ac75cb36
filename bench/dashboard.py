"""Dashboard page time with 100 queues: ``python -m bench.dashboard``.

Starts a private redis-server (``delayq.embedded``), fills ``--queues`` queues with tasks in
every state, serves the dashboard with uvicorn on a free port and measures:

- ``stats_round``: the dashboard's read of every queue's stats (one pipelined round), against
  the same reads awaited one after another;
- ``http``: ``GET /`` (the main page, rendered) over HTTP, from request to last byte;
- ``browser``: the main page in headless Chromium (navigation start to ``load``), if
  ``/usr/bin/chromium`` is there.

Prints the figures and writes ``bench/results/dashboard.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, running

from delayq import AsyncDelayQueue, DelayQueue
from delayq.dashboard import Settings
from delayq.dashboard.monitor import Monitor
from delayq.embedded import EmbeddedRedis

RESULTS = Path(__file__).parent / "results"


def figures(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
        "max_ms": round(ordered[-1], 2),
        "samples": len(ordered),
    }


def fill(url: str, queues: int, prefix: str) -> None:
    """Every queue gets delayed, ready, in-flight and dead tasks."""
    for i in range(queues):
        q = DelayQueue(f"queue-{i:03d}", url, prefix=prefix)
        q.offer_many([({"n": n, "note": "x" * 80}, 600 + n) for n in range(50)])
        q.offer_many([({"n": n}, 0) for n in range(8)])
        leased = q.poll_many(4)
        for task in leased[:2]:
            q.reject(task, "bench: dead on purpose")
        q.close()


async def stats_rounds(url: str, prefix: str, rounds: int) -> dict[str, Any]:
    monitor = Monitor(url, prefix)
    names = await monitor.names()
    await monitor.snapshot(names)  # script loaded, connections open
    pipelined = []
    for _ in range(rounds):
        start = time.perf_counter()
        await monitor.snapshot(names)
        pipelined.append((time.perf_counter() - start) * 1000)
    await monitor.close()
    sequential = []
    qs = [AsyncDelayQueue(n, url, prefix=prefix) for n in names]
    for q in qs:
        await q.stats()
    for _ in range(rounds):
        start = time.perf_counter()
        for q in qs:
            await q.stats()
        sequential.append((time.perf_counter() - start) * 1000)
    for q in qs:
        await q.close()
    return {
        "queues": len(names),
        "pipelined": figures(pipelined),
        "one_by_one": figures(sequential),
    }


def http_times(base: str, requests: int) -> dict[str, Any]:
    times = []
    with httpx.Client(base_url=base) as client:
        client.get("/").raise_for_status()
        for _ in range(requests):
            start = time.perf_counter()
            response = client.get("/")
            times.append((time.perf_counter() - start) * 1000)
            response.raise_for_status()
    return {**figures(times), "bytes": len(response.content)}


def browser_times(base: str, loads: int) -> dict[str, Any] | None:
    if not os.path.exists(CHROMIUM):
        return None
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(base)
        for _ in range(loads):
            page.goto(base, wait_until="load")
            times.append(
                page.evaluate(
                    "() => { const n = performance.getEntriesByType('navigation')[0];"
                    " return n.loadEventEnd - n.startTime; }"
                )
            )
        rows = page.locator("tr[data-queue]").count()
        browser.close()
    return {**figures(times), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    args = parser.parse_args(argv)
    server = EmbeddedRedis().start()
    prefix = "bench"
    try:
        fill(server.url, args.queues, prefix)
        result: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "redis": server.version,
            "stats_round": asyncio.run(stats_rounds(server.url, prefix, args.requests)),
        }
        settings = Settings(redis_url=server.url, prefix=prefix, sample_interval_s=5.0)
        with running(settings) as base:
            result["http"] = http_times(base, args.requests)
            result["browser"] = browser_times(base, min(args.requests, 20))
    finally:
        server.stop()
    sr, http, browser = result["stats_round"], result["http"], result["browser"]
    print(f"{sr['queues']} queues, redis {result['redis']}, {os.cpu_count()} CPUs")
    print(
        f"stats of all queues: pipelined median {sr['pipelined']['median_ms']} ms "
        f"(p95 {sr['pipelined']['p95_ms']}), one by one {sr['one_by_one']['median_ms']} ms"
    )
    print(
        f"GET / over HTTP: median {http['median_ms']} ms, p95 {http['p95_ms']} ms, "
        f"max {http['max_ms']} ms ({http['bytes']:,} bytes)"
    )
    if browser:
        print(
            f"Chromium load of /: median {browser['median_ms']} ms, p95 {browser['p95_ms']} ms, "
            f"max {browser['max_ms']} ms ({browser['rows']} rows)"
        )
    verdict = max(http["max_ms"], (browser or {}).get("max_ms", 0)) < 1000
    print("bar (< 1 s with 100 queues):", "met" if verdict else "MISSED")
    result["bar_1s_met"] = verdict
    if not args.no_json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "dashboard.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
