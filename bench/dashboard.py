"""Dashboard page time and memory: ``python -m bench.dashboard [--scenario ...]``.

Starts a private redis-server (``delayq.embedded``) and measures, by scenario:

- ``pages`` (default; 100 queues with tasks in every state, served by uvicorn on a free port):
  ``stats_round``, the dashboard's read of every queue's stats (one pipelined round) against
  the same reads awaited one after another; ``http``, ``GET /`` from request to last byte;
  ``browser``, the main page in headless Chromium (navigation start to ``load``), if
  ``/usr/bin/chromium`` is there.
- ``many`` (2,000 queues, the bar of issue 14: the main page in <= 200 ms): ``GET /`` over
  HTTP from uvicorn with the sampler running (``warm``: the summary of all queues comes from
  the sampler's last round, the 100 rows shown are read fresh), and without a sampler (the
  first page reads all 2,000 queues; ``stale``: later pages show the summary the page before
  refreshed after its response).
- ``memory`` (in process, tracemalloc and RSS): 10,000 distinct queue names requested (as
  another site can make a browser do), and the history of 2,000 queues after an hour of
  sampler rounds (720 rounds, replayed without waiting).

Prints the figures and writes ``bench/results/dashboard[-SCENARIO].json``.
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
from delayq.dashboard import Settings, create_app
from delayq.dashboard.monitor import Monitor
from delayq.dashboard.series import Sample
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


def http_times(base: str, requests: int, path: str = "/") -> dict[str, Any]:
    times = []
    with httpx.Client(base_url=base) as client:
        client.get(path).raise_for_status()
        for _ in range(requests):
            start = time.perf_counter()
            response = client.get(path)
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


def fill_many(url: str, queues: int, prefix: str) -> None:
    """Many small queues on one connection: 3 delayed tasks each, one dead task in 1 of 50."""
    import redis

    client = redis.Redis.from_url(url)
    for i in range(queues):
        q = DelayQueue(f"queue-{i:04d}", client, prefix=prefix)
        q.offer_many([({"n": n, "note": "x" * 40}, 600 + n) for n in range(3)])
        if i % 50 == 0:
            q.offer({"dead": i}, delay=0)
            for task in q.poll_many(1):
                q.reject(task, "RuntimeError: bench: dead on purpose")
        q.close()
    client.close()


def many(server: EmbeddedRedis, queues: int, requests: int) -> dict[str, Any]:
    prefix = "many"
    fill_many(server.url, queues, prefix)
    result: dict[str, Any] = {"queues": queues}
    warm = Settings(redis_url=server.url, prefix=prefix, sample_interval_s=5.0)
    with running(warm) as base:
        wait_for_sampler(base)
        result["warm"] = http_times(base, requests)
        result["warm_page_2"] = http_times(base, max(5, requests // 5), "/?page=2")
    # No sampler (the app mounted without its lifespan), and a summary older than 1 ms is
    # stale: the first request reads every queue; later ones show the summary the previous
    # one refreshed after its response ("stale").
    cold = Settings(redis_url=server.url, prefix=prefix, sample_interval_s=0.001)
    with running(cold, sampler=False) as base:
        start = time.perf_counter()
        httpx.get(base).raise_for_status()
        result["first_ms"] = round((time.perf_counter() - start) * 1000, 2)
        result["stale"] = http_times(base, max(5, requests // 2))
    return result


def wait_for_sampler(base: str) -> None:
    """Until the sampler's first round is in (the page then says how much history it has)."""
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=base) as client:
        while "no samples yet" in client.get("/").text:
            if time.monotonic() > deadline:
                raise RuntimeError("the dashboard's sampler did not run")
            time.sleep(0.2)


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def memory(server: EmbeddedRedis, names: int, history_queues: int) -> dict[str, Any]:
    import gc
    import tracemalloc

    prefix = "mem"
    q = AsyncDelayQueue("real", server.url, prefix=prefix)
    await q.offer({"x": 1}, delay=600)
    await q.close()
    app = create_app(Settings(redis_url=server.url, prefix=prefix))
    board = app.state.dashboard
    result: dict[str, Any] = {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:

        async def request(first: int, count: int) -> None:
            for start in range(first, first + count, 100):
                batch = [client.get(f"/q/name-{i}") for i in range(start, start + 100)]
                assert {r.status_code for r in await asyncio.gather(*batch)} == {404}

        await request(0, 1000)  # warm-up
        gc.collect()
        tracemalloc.start()
        traced0, rss0 = tracemalloc.get_traced_memory()[0], rss_bytes()
        checkpoints = []
        for done in range(0, names, names // 5):
            await request(1000 + done, names // 5)
            gc.collect()
            checkpoints.append(
                {
                    "names": done + names // 5,
                    "traced_growth_bytes": tracemalloc.get_traced_memory()[0] - traced0,
                    "rss_growth_bytes": rss_bytes() - rss0,
                }
            )
        tracemalloc.stop()
        result["names"] = {"requested": names, "cached_queues": board.monitor.cached,
                           "checkpoints": checkpoints}  # fmt: skip
    await board.monitor.close()
    # An hour of sampler rounds for many queues: the history's own memory.
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    history = board.history
    lateness = {0.001: 0, 0.005: 0, 0.01: 0, 0.05: 0, 0.1: 0, 1.0: 0, float("inf"): 0}
    for round_no in range(720):
        t = 1_000_000.0 + 5 * round_no
        samples = {
            f"queue-{i:04d}": Sample(t, round_no * (i % 3), round_no * (i % 3), lateness)
            for i in range(history_queues)
        }
        history.record(samples, t)
    gc.collect()
    result["history"] = {
        "queues": history_queues,
        "rounds": 720,
        "tracked": len(history.queues),
        "traced_bytes": tracemalloc.get_traced_memory()[0] - before,
    }
    tracemalloc.stop()
    return result


def print_many(result: dict[str, Any]) -> None:
    load = result["machine"]["load_average_1m_at_start"]
    print(f"{result['queues']} queues, main page over HTTP from uvicorn (load average {load}):")
    print(f"  first page without a sampler (reads all queues): {result['first_ms']} ms")
    for key in ("warm", "warm_page_2", "stale"):
        f = result[key]
        print(
            f"  {key}: median {f['median_ms']} ms, p95 {f['p95_ms']} ms, max {f['max_ms']} ms "
            f"({f['bytes']:,} bytes)"
        )
    verdict = result["warm"]["p95_ms"] <= 200
    print("bar (main page with 2,000 queues <= 200 ms, p95 warm):", "met" if verdict else "MISSED")
    result["bar_200ms_met"] = verdict


def print_memory(result: dict[str, Any]) -> None:
    names = result["names"]
    print(f"{names['requested']:,} distinct queue names requested (after 1,000 warm-up):")
    for c in names["checkpoints"]:
        print(
            f"  after {c['names']:>6,}: traced {c['traced_growth_bytes'] / 1e3:+,.0f} KB, "
            f"RSS {c['rss_growth_bytes'] / 1e3:+,.0f} KB"
        )
    print(f"  queue objects cached: {names['cached_queues']}")
    h = result["history"]
    print(
        f"history of {h['queues']:,} queues after {h['rounds']} rounds: {h['tracked']} tracked, "
        f"{h['traced_bytes'] / 1e6:.1f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("pages", "many", "memory"), default="pages")
    parser.add_argument("--queues", type=int, default=None, help="100 (pages), 2000 (many)")
    parser.add_argument("--names", type=int, default=10_000, help="names requested (memory)")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    args = parser.parse_args(argv)
    if args.scenario != "pages":
        return other_scenario(args)
    args.queues = args.queues or 100
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


def other_scenario(args: argparse.Namespace) -> int:
    server = EmbeddedRedis().start()
    try:
        head: dict[str, Any] = {
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                # The VM is shared: the other processes' load is part of the figures.
                "load_average_1m_at_start": round(os.getloadavg()[0], 2),
            },
            "redis": server.version,
        }
        if args.scenario == "many":
            result = {**head, **many(server, args.queues or 2000, args.requests)}
            print_many(result)
        else:
            result = {**head, **asyncio.run(memory(server, args.names, args.queues or 2000))}
            print_memory(result)
    finally:
        server.stop()
    if not args.no_json:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"dashboard-{args.scenario}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
