"""Exporter benchmark: one Prometheus scrape of 100 queues holding 1,000,000 tasks.

``python -m bench.exporter`` starts a private redis-server, fills it (tasks in every state,
deliveries so that the lateness histograms are not empty), serves ``delayq exporter``'s
collector over HTTP and times scrapes: the HTTP answer (what Prometheus waits for), the
collector's own Redis round (``delayq_exporter_scrape_duration_seconds``) and the time Redis
spent in the ``stats`` scripts (``INFO commandstats``). Bar: a scrape answers in < 50 ms.
Writes bench/results/exporter.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry, start_http_server

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.metrics import QueueCollector, start_exporter

RESULTS = Path(__file__).parent / "results"
LABELS = {
    "http_scrape_ms": "HTTP scrape, ms (the bar)",
    "collector_read_ms": "  of which reading Redis, ms",
    "redis_round_only_ms": "Redis round alone (SMEMBERS + pipeline), ms",
    "redis_server_ms": "Redis server time in stats scripts, ms",
    "http_scrape_via_prometheus_client_exposition_ms": "same, prometheus-client exposition, ms",
}
BAR_MS = 50.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def fill(url: str, prefix: str, queues: int, per_queue: int) -> dict[str, Any]:
    """``queues`` queues of ``per_queue`` tasks: mostly delayed, some due, inflight, dead."""
    client = redis.Redis.from_url(url)
    started = time.perf_counter()
    payload = {"order_id": 123456, "note": "close if unpaid"}
    for n in range(queues):
        q = DelayQueue(f"orders-{n:03d}", client, prefix=prefix, max_attempts=1)
        due_now = per_queue // 10
        offers = [(payload, 0.0)] * (due_now + 100)  # 100 are acked below
        offers += [(payload, 3600 + i % 86_400) for i in range(per_queue - due_now)]
        q.offer_many(offers)
        taken = q.poll_many(200, timeout=5)  # deliveries: lateness histogram, inflight
        q.ack_many(taken[:100])
        for task in taken[100:120]:
            q.retry(task, error="bench")  # max_attempts=1: dead-lettered
        q.close()
    elapsed = time.perf_counter() - started
    client.close()
    return {"queues": queues, "tasks": queues * per_queue, "fill_s": round(elapsed, 1)}


def evalsha_usec(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("usec", 0))


def generic_endpoint(url: str, prefix: str) -> tuple[str, Callable[[], None]]:
    """The same collector served by prometheus-client's own exposition, for comparison."""
    registry = CollectorRegistry()
    collector = QueueCollector(url, prefix=prefix)
    registry.register(collector)
    server, thread = start_http_server(0, "127.0.0.1", registry)

    def stop() -> None:
        server.shutdown()
        thread.join(5)
        collector.close()

    return f"http://127.0.0.1:{server.server_port}/metrics", stop


def measure(url: str, prefix: str, scrapes: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    server = start_exporter(url, port=0, prefix=prefix)
    direct = QueueCollector(url, prefix=prefix)
    generic_url, stop_generic = generic_endpoint(url, prefix)
    try:
        generic_ms = []
        for i in range(scrapes + 2):
            start = time.perf_counter()
            with urllib.request.urlopen(generic_url, timeout=10) as response:
                response.read()
            if i >= 2:
                generic_ms.append((time.perf_counter() - start) * 1000)
        http_ms, redis_round_ms, server_ms = [], [], []
        body = b""
        for i in range(scrapes + 2):  # two warm-up scrapes: connections, script load
            before = evalsha_usec(client)
            start = time.perf_counter()
            with urllib.request.urlopen(server.url, timeout=10) as response:
                body = response.read()
            took = (time.perf_counter() - start) * 1000
            used = (evalsha_usec(client) - before) / 1000
            if i < 2:
                continue
            http_ms.append(took)
            server_ms.append(used)
            for line in body.decode().splitlines():
                if line.startswith("delayq_exporter_scrape_duration_seconds "):
                    redis_round_ms.append(float(line.split()[1]) * 1000)
        read_ms = []
        for _ in range(scrapes):
            start = time.perf_counter()
            rows = direct.read()
            read_ms.append((time.perf_counter() - start) * 1000)
        stored = sum(s.total for s in rows)
    finally:
        stop_generic()
        direct.close()
        server.stop()
        client.close()

    def summary(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 2), "p95": round(pct(values, 0.95), 2)}

    return {
        "scrapes": scrapes,
        "queues_reported": len(rows),
        "tasks_stored": stored,
        "response_bytes": len(body),
        "http_scrape_ms": summary(http_ms),
        "collector_read_ms": summary(redis_round_ms),
        "redis_round_only_ms": summary(read_ms),
        "redis_server_ms": summary(server_ms),
        "http_scrape_via_prometheus_client_exposition_ms": summary(generic_ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=1_000_000, help="in total")
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--no-json", action="store_true", help="do not write results")
    args = parser.parse_args(argv)
    binary = shutil.which("redis-server")
    with EmbeddedRedis(binary) as server:
        prefix = "bench"
        print(f"redis-server {server.version} on port {server.port}")
        filled = fill(server.url, prefix, args.queues, args.tasks // args.queues)
        print(f"filled {filled['tasks']:,} tasks in {filled['queues']} queues "
              f"in {filled['fill_s']} s")  # fmt: skip
        result = {**filled, **measure(server.url, prefix, args.scrapes)}
    result["redis_version"] = server.version
    result["python"] = platform.python_version()
    result["bar_ms"] = BAR_MS
    result["meets_bar"] = result["http_scrape_ms"]["p95"] < BAR_MS
    for key, label in LABELS.items():
        print(f"{label:<44} median {result[key]['median']:7.2f}   p95 {result[key]['p95']:7.2f}")
    print(f"response {result['response_bytes']:,} bytes; {result['queues_reported']} queues, "
          f"{result['tasks_stored']:,} tasks; bar < {BAR_MS:.0f} ms: "
          f"{'met' if result['meets_bar'] else 'MISSED'}")  # fmt: skip
    if not args.no_json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "exporter.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["meets_bar"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
