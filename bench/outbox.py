"""The PostgreSQL outbox's figures (issue #11): commit -> task in its queue, and the relay's
throughput against direct ``offer_many``, in the same run.

    .venv/bin/python -m bench.outbox                  # the full run (about a minute)
    .venv/bin/python -m bench.outbox --quick          # tiny sizes: checks the harness
    .venv/bin/python -m bench.outbox --json out.json  # also write the figures

It creates a private database ``delayq_bench_<random>`` on the local PostgreSQL server
(``--pg``, default ``postgresql://postgres@127.0.0.1:5432/postgres``), drops it at the end,
and starts a private ``redis-server`` on a free port.

- latency: one relay (``delayq relay``, a process of its own); the producer commits one
  offer per transaction, one at a time; the clock starts when ``commit`` returns and stops
  when the queue's channel announces the task (the offer script publishes a task due
  earlier than every other one as it writes it; each sample is due a second before the
  previous). Figures: p50, p90, p99, max.
- throughput: N rows committed while no relay runs, then one relay drains them (rows/s from
  its start to an empty table), against ``DelayQueue.offer_many`` of the same N payloads in
  chunks of the relay's batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import redis

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, Relay


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def start_relay_process(dsn: str, url: str, table: str) -> subprocess.Popen[bytes]:
    """``delayq relay`` in its own process, as it runs in production (in a thread of this
    process it would share the GIL with the polling loop below)."""
    name = f"bench-relay-{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "-m", "delayq.cli", "relay", "--dsn", dsn, "--redis", url]
    args += ["--table", table, "--name", name, "--sweep-interval", "60"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            if found and found[0] >= 2:
                return proc
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the relay did not connect within 30 s")
            time.sleep(0.05)


def measure_latency(outbox: Outbox, dsn: str, url: str, table: str, samples: int) -> dict[str, Any]:
    relay = start_relay_process(dsn, url, table)
    client = redis.Redis.from_url(url)
    queue = DelayQueue("lat", url)
    # Each task is due a second before the one offered just before it, so the offer script
    # announces each on the queue's channel the moment the task is written: the probe
    # blocks on that message instead of spinning on one of the two cores.
    events = client.pubsub(ignore_subscribe_messages=True)
    events.subscribe(queue.keys.channel)
    lat_ms: list[float] = []
    try:
        with psycopg.connect(dsn) as conn:
            for i in range(samples + 50):
                with conn.transaction():
                    task_id = outbox.offer(conn, "lat", {"n": i}, 100_000 - i)
                start = time.perf_counter()
                # (None also for the ignored subscribe confirmation: wait on)
                while events.get_message(timeout=5.0) is None:
                    if time.perf_counter() - start > 5:
                        raise RuntimeError(f"task {task_id} did not arrive within 5 s")
                elapsed = time.perf_counter() - start
                if not client.hexists(queue.keys.key("tasks"), task_id):
                    raise RuntimeError(f"announced, but task {task_id} is not in the queue")
                if i >= 50:  # the first ones warm the connections and caches
                    lat_ms.append(elapsed * 1000)
    finally:
        relay.terminate()
        relay.wait(10)
        events.close()
        client.close()
        queue.close()
    return {
        "samples": len(lat_ms),
        "p50_ms": round(percentile(lat_ms, 50), 3),
        "p90_ms": round(percentile(lat_ms, 90), 3),
        "p99_ms": round(percentile(lat_ms, 99), 3),
        "max_ms": round(max(lat_ms), 3),
        "mean_ms": round(statistics.fmean(lat_ms), 3),
    }


def measure_throughput(
    outbox: Outbox, dsn: str, url: str, table: str, count: int, batch: int
) -> dict[str, Any]:
    payloads = [{"order_id": i, "note": "close if unpaid"} for i in range(count)]
    with psycopg.connect(dsn) as conn:
        for start in range(0, count, 1000):
            with conn.transaction():
                for payload in payloads[start : start + 1000]:
                    outbox.offer(conn, "thr", payload, 3600)
    relay = Relay(dsn, url, table=table, batch_size=batch, sweep_interval=60)
    started = time.perf_counter()
    relayed = relay.relay_pending()
    relay_s = time.perf_counter() - started
    assert relayed == count, (relayed, count)

    with DelayQueue("direct", url) as queue:
        queue.offer_many([(payloads[0], 3600)])  # connection and script load, untimed
        started = time.perf_counter()
        for start in range(0, count, batch):
            queue.offer_many([(p, 3600) for p in payloads[start : start + batch]])
        direct_s = time.perf_counter() - started
    with DelayQueue("thr", url) as queue:
        assert queue.stats().delayed == count
    return {
        "rows": count,
        "batch_size": batch,
        "relay_rows_per_s": round(count / relay_s),
        "direct_offer_many_per_s": round(count / direct_s),
        "relay_vs_direct": round(relay_s / direct_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples")
    parser.add_argument("--count", type=int, default=50_000, help="rows for throughput")
    parser.add_argument("--batch", type=int, default=500, help="relay batch size")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.count = 50, 2000
    name = f"delayq_bench_{uuid.uuid4().hex[:10]}"
    base = args.pg.rpartition("/")[0]
    dsn = f"{base}/{name}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    results: dict[str, Any] = {}
    try:
        with EmbeddedRedis() as server:
            outbox = Outbox(dsn)
            outbox.install()
            results["redis"] = server.version
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                results["postgresql"] = row[0] if row else "?"
            results["latency"] = measure_latency(
                outbox, dsn, server.url, outbox.table, args.samples
            )
            results["throughput"] = measure_throughput(
                outbox, dsn, server.url, outbox.table, args.count, args.batch
            )
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    lat, thr = results["latency"], results["throughput"]
    print(f"PostgreSQL {results['postgresql']}, Redis {results['redis']}, one relay")
    print(
        f"commit -> task in its queue ({lat['samples']} transactions, one at a time): "
        f"p50 {lat['p50_ms']} ms  p90 {lat['p90_ms']} ms  p99 {lat['p99_ms']} ms  "
        f"max {lat['max_ms']} ms"
    )
    print(
        f"throughput ({thr['rows']} rows, batches of {thr['batch_size']}): relay "
        f"{thr['relay_rows_per_s']} rows/s, direct offer_many {thr['direct_offer_many_per_s']} "
        f"tasks/s (relay takes {thr['relay_vs_direct']}x as long)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
