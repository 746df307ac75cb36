"""The outbox under faults (issue #23): N outbox offers through two relays while the relays'
DELETE fails 1 % of the time and a relay is SIGKILLed every 20 s; every task is delivered to
a consumer that acks it at once, and each delivery is counted: the bar is exactly one each.

    .venv/bin/python -m bench.outbox_chaos                 # 100,000 offers at 1,000/s (~2 min)
    .venv/bin/python -m bench.outbox_chaos --count 20000   # a shorter run
    .venv/bin/python -m bench.outbox_chaos --json out.json

A private database ``delayq_bench_<random>`` on the local PostgreSQL server (``--pg``) and a
private ``redis-server`` on a free port; both go at the end. The relays are ``delayq relay``
processes (restarted at once after each kill), the consumer a process of its own; the
producer commits ``--per-tx`` offers per transaction at ``--rate`` offers/s (0: as fast as
it can), each due at once, so a task is delivered and acked within milliseconds of its
commit, and any re-application of its row would be a second delivery. The failing DELETE is
a trigger (``random() < --fail``), counted in a sequence.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox


def start_relay(dsn: str, url: str, name: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "delayq.cli", "relay", "--dsn", dsn, "--redis", url]
    args += ["--name", name, "--sweep-interval", "1", "--log-level", "ERROR"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def consume(url: str, out: str, stop: Any) -> None:
    """Take and ack every task of the queue, counting deliveries per id (a process)."""
    counts: Counter[str] = Counter()
    with DelayQueue("chaos", url) as queue:
        while not stop.is_set():
            tasks = queue.poll_many(500, 0.2)
            for task in tasks:
                counts[task.id] += 1
            if tasks:
                queue.ack_many(tasks)
    Path(out).write_text(json.dumps(counts))


def fail_some_deletes(dsn: str, share: float) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE SEQUENCE delete_failures")
        conn.execute("CREATE SEQUENCE deletes")
        conn.execute(
            f"""CREATE FUNCTION fail_some() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM nextval('deletes');
                IF random() < {float(share)} THEN
                    PERFORM nextval('delete_failures');
                    RAISE EXCEPTION 'injected commit failure';
                END IF;
                RETURN OLD;
            END $$"""
        )
        conn.execute(
            "CREATE TRIGGER fail_some BEFORE DELETE ON delayq_outbox "
            "FOR EACH STATEMENT EXECUTE FUNCTION fail_some()"
        )


_FAILURES = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM delete_failures"


def scalar(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return row[0] if row else None


def run(args: argparse.Namespace, dsn: str, server: EmbeddedRedis) -> dict[str, Any]:
    outbox = Outbox(dsn)
    outbox.install()
    fail_some_deletes(dsn, args.fail)
    with DelayQueue("chaos", server.url, create=True) as queue:
        queue.stats()
    out = str(Path(args.workdir) / f"deliveries-{uuid.uuid4().hex[:6]}.json")
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    consumer = ctx.Process(target=consume, args=(server.url, out, stop))
    consumer.start()
    relays = [start_relay(dsn, server.url, f"chaos-{i}") for i in range(2)]
    kills, next_kill, victim = 0, time.monotonic() + args.kill_every, 0
    ids: list[str] = []
    started = time.monotonic()
    try:
        with psycopg.connect(dsn) as conn:
            while len(ids) < args.count:
                with conn.transaction():
                    for _ in range(min(args.per_tx, args.count - len(ids))):
                        ids.append(outbox.offer(conn, "chaos", {"n": len(ids)}, 0))
                if args.rate:
                    ahead = started + len(ids) / args.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)  # the producer's pace, not a wait for a result
                if time.monotonic() >= next_kill:
                    relays[victim].send_signal(signal.SIGKILL)
                    relays[victim].wait(10)
                    relays[victim] = start_relay(dsn, server.url, f"chaos-{victim}")
                    kills, victim = kills + 1, 1 - victim
                    next_kill += args.kill_every
        produced_s = time.monotonic() - started
        deadline = time.monotonic() + 300
        while scalar(dsn, "SELECT count(*) FROM delayq_outbox WHERE status = 'pending'"):
            if time.monotonic() > deadline:
                raise RuntimeError("the outbox did not drain within 300 s")
            time.sleep(0.2)
        drained_s = time.monotonic() - started
        with DelayQueue("chaos", server.url) as queue:
            while (st := queue.stats()).delayed + st.ready + st.inflight:
                if time.monotonic() > deadline:
                    raise RuntimeError("the consumer did not finish within 300 s")
                time.sleep(0.2)
            counters = queue.stats().counters
        # Every application a re-claim could make has had its chance: rows are gone.
        time.sleep(1.0)
    finally:
        stop.set()
        consumer.join(30)
        for relay in relays:
            relay.terminate()
            relay.wait(10)
    counts: Counter[str] = Counter(json.loads(Path(out).read_text()))
    Path(out).unlink()
    wanted = set(ids)
    return {
        "offers": len(ids),
        "delivered_distinct": len(wanted & set(counts)),
        "lost": len(wanted - set(counts)),
        "duplicate_deliveries": sum(n - 1 for n in counts.values() if n > 1),
        "ghosts": len(set(counts) - wanted),
        "relay_kills": kills,
        "delete_failures": int(scalar(dsn, _FAILURES) or 0),
        "deletes": int(scalar(dsn, _FAILURES.replace("delete_failures", "deletes")) or 0),
        "receipts_refused": int(counters.get("applied_before", 0)),
        "offered_counter": int(counters.get("offered", 0)),
        "dead_rows": int(scalar(dsn, "SELECT count(*) FROM delayq_outbox") or 0),
        "produce_s": round(produced_s, 1),
        "drained_s": round(drained_s, 1),
        "rows_per_s_end_to_end": round(len(ids) / drained_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1000.0, help="offers/s; 0: unpaced")
    parser.add_argument("--per-tx", type=int, default=10, help="offers per transaction")
    parser.add_argument("--fail", type=float, default=0.01, help="share of DELETEs that fail")
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    name = f"delayq_bench_{uuid.uuid4().hex[:10]}"
    dsn = f"{args.pg.rpartition('/')[0]}/{name}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with EmbeddedRedis() as server:
            result = run(args, dsn, server)
            result["redis"] = server.version
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"{result['offers']} outbox offers, two relays, {result['delete_failures']} of "
        f"{result['deletes']} DELETEs failed, {result['relay_kills']} relay SIGKILLs "
        f"(Redis {result['redis']})"
    )
    print(
        f"delivered {result['delivered_distinct']}: lost {result['lost']}, duplicate "
        f"deliveries {result['duplicate_deliveries']}, ghosts {result['ghosts']}; receipts "
        f"refused {result['receipts_refused']} re-applications; offered counter "
        f"{result['offered_counter']}; rows left {result['dead_rows']}"
    )
    print(
        f"produced in {result['produce_s']} s, drained at {result['drained_s']} s: "
        f"{result['rows_per_s_end_to_end']} rows/s end to end (paced at {args.rate:g}/s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = result["lost"] == result["duplicate_deliveries"] == result["ghosts"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
