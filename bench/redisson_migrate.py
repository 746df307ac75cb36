"""A live Redisson queue moved into delayq (issue #24): ``python -m bench.redisson_migrate``.

```console
$ .venv/bin/python -m bench.redisson_migrate               # 100,000 due over 10 min, ~11 min
$ .venv/bin/python -m bench.redisson_migrate --span 120    # the same tasks due over 2 min
$ .venv/bin/python -m bench.redisson_migrate --tasks 2000 --span 20 --rate 20   # a smoke run
```

On a private redis-server (the one on PATH, a free port of 127.0.0.1):

1. ``--tasks`` Redisson tasks (3.21.1+ members, StringCodec) are offered in Redisson's own
   format (delayq's ``redisson_offer`` script, pipelined), due uniformly over the next
   ``--span`` seconds, as Java producers would have left them;
2. ``delayq redisson migrate --follow`` runs (``Migration.run(follow=True)`` in a thread),
   while a Redisson-format producer (:class:`RedissonDelayedQueue`) offers ``--rate`` more
   per second, each due 1-60 s later, until the span is nearly over;
3. two consumer processes take the tasks from delayq (``poll_many`` + ``ack_many``) and
   record each delivery.

It reports the bulk migration rate (tasks/s until the backlog first ran dry), whether every
task was delivered once (none lost, none twice), deliveries before their due time (the bar: 0;
the due time is Redisson's score, the offering client's clock, which is this host's, as is
Redis's), and the lateness (handler start minus due time) of the tasks due after the bulk
move, p50/p99/max (the bar: p99 <= 10 ms). Tasks that fell due while the bulk move ran are
counted apart: with no Redisson timer running they waited for the move.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sys
import threading
import time
import uuid
from typing import Any

import redis

from delayq import DelayQueue
from delayq._core.redisson import RedissonKeys, pack_member
from delayq._core.scripts import Op, script
from delayq.embedded import EmbeddedRedis
from delayq.redisson import Migration, RedissonDelayedQueue

NAME = "orders"
BAR_P99_MS = 10.0


def now_ms() -> int:
    return int(time.time() * 1000)


def load(url: str, tasks: int, span_s: float) -> int:
    """Offer ``tasks`` Redisson tasks due over the span; the epoch ms the span starts at."""
    client = redis.Redis.from_url(url)
    offer = script(Op.REDISSON_OFFER)
    client.script_load(offer.source)
    keys = RedissonKeys(NAME)
    start = now_ms()
    pipe = client.pipeline(transaction=False)
    for i in range(tasks):
        due = start + int(span_s * 1000 * i / tasks)
        member = pack_member(f"bulk-{i}".encode())
        pipe.evalsha(offer.sha, 4, keys.destination, keys.timeouts, keys.members, keys.channel,
                     due, member)  # fmt: skip
        if len(pipe) == 1000:
            pipe.execute()
    pipe.execute()
    client.close()
    return start


def consume(url: str, prefix: str, ready: Any, stop: Any, out: Any) -> None:
    """A consumer process: records (payload, due ms, delivered ms, handled ms) per task."""
    rows = []
    with DelayQueue(NAME, url, prefix=prefix, create=True) as queue:
        queue.poll_many(100, timeout=0)  # connected and subscribed before the move starts
        ready.release()
        while not stop.is_set():
            tasks = queue.poll_many(100, timeout=0.5)
            handled = time.time() * 1000
            for task in tasks:
                rows.append((task.payload, task.due_ms, task.delivered_ms, handled))
            if tasks:
                queue.ack_many(tasks)
    out.put(rows)


def produce(url: str, rate: float, until_ms: int, offered: list[str]) -> None:
    """Java producers still running: ``rate`` Redisson offers per second."""
    rng = random.Random(7)
    with RedissonDelayedQueue(NAME, url) as java:
        i, started = 0, time.monotonic()
        while now_ms() < until_ms:
            delay = rng.uniform(1.0, min(60.0, max(1.0, (until_ms - now_ms()) / 1000)))
            value = f"live-{i}"
            java.offer(value, delay)
            offered.append(value)
            i += 1
            pause = started + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--span", type=float, default=600.0, help="seconds the tasks fall due over")
    parser.add_argument("--rate", type=float, default=100.0, help="live offers per second")
    parser.add_argument("--consumers", type=int, default=2)
    args = parser.parse_args(argv)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    server = EmbeddedRedis(binary).start()
    try:
        return run(server.url, args)
    finally:
        server.stop()


def run(url: str, args: argparse.Namespace) -> int:
    prefix = f"bench-rdq-{uuid.uuid4().hex[:6]}"
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    consumers = [ctx.Process(target=consume, args=(url, prefix, ready, stop, out))
                 for _ in range(args.consumers)]  # fmt: skip
    for process in consumers:
        process.start()
    for _ in consumers:
        if not ready.acquire(timeout=60):
            raise SystemExit("a consumer process did not start in 60 s")

    print(f"loading {args.tasks:,} Redisson tasks due over {args.span:g} s ...", flush=True)
    t0 = time.monotonic()
    start_ms = load(url, args.tasks, args.span)
    print(f"  loaded in {time.monotonic() - t0:.1f} s", flush=True)
    end_ms = start_ms + int(args.span * 1000)

    offered: list[str] = []
    producer = threading.Thread(target=produce, args=(url, args.rate, end_ms - 2000, offered))
    migration = Migration(NAME, NAME, url, prefix=prefix)
    bulk_done: list[float] = []
    finished = threading.Event()

    def on_batch(counts: Any) -> None:
        if not bulk_done and counts.moved >= args.tasks:
            bulk_done.append(time.monotonic())

    summary: list[Any] = []
    began = time.monotonic()
    move_started_ms = now_ms()

    def follow() -> None:
        summary.append(migration.run(follow=True, stop=finished.is_set, on_batch=on_batch))

    mover = threading.Thread(target=follow)
    mover.start()
    producer.start()
    producer.join()
    # every task is due by end_ms; give the last ones a moment to be delivered
    while now_ms() < end_ms + 3000:
        time.sleep(0.2)
    finished.set()
    mover.join()
    migration.close()
    stop.set()
    rows = [row for _ in consumers for row in out.get(timeout=60)]
    for process in consumers:
        process.join(10)

    bulk_s = (bulk_done[0] if bulk_done else time.monotonic()) - began
    move_done_ms = move_started_ms + int(bulk_s * 1000)
    expected = {f"bulk-{i}" for i in range(args.tasks)} | set(offered)
    seen: dict[str, int] = {}
    for payload, *_ in rows:
        seen[payload] = seen.get(payload, 0) + 1
    lost = len(expected - set(seen))
    doubled = sum(1 for n in seen.values() if n > 1)
    early = sum(1 for _, due, delivered, _ in rows if delivered < due)
    after = [handled - due for _, due, _, handled in rows if due >= move_done_ms]
    after_bulk = [h - d for p, d, _, h in rows if d >= move_done_ms and p.startswith("bulk-")]
    after_live = [h - d for p, d, _, h in rows if d >= move_done_ms and p.startswith("live-")]
    during = [handled - due for _, due, _, handled in rows if due < move_done_ms]
    load1, load5, _ = os.getloadavg()
    s = summary[0]
    print(s.text())
    print(
        "\n".join(
            [
                f"bulk move       {args.tasks:,} tasks in {bulk_s:.2f} s = "
                f"{args.tasks / bulk_s:,.0f} tasks/s (atomic batches of 100)",
                f"live offers     {len(offered):,} at {args.rate:g}/s during --follow",
                f"delivered       {len(rows):,} of {len(expected):,}: lost {lost}, twice "
                f"{doubled}, early {early}",
                f"lateness        due after the bulk move ({len(after):,} tasks): p50 "
                f"{pct(after, 0.5):.1f} ms, p99 {pct(after, 0.99):.1f} ms, max "
                f"{max(after, default=float('nan')):.1f} ms (bar p99 <= {BAR_P99_MS:g} ms)",
                f"                of which migrated in bulk: p99 {pct(after_bulk, 0.99):.1f} ms; "
                f"offered live, moved by --follow: p99 {pct(after_live, 0.99):.1f} ms",
                f"                due during the bulk move ({len(during):,} tasks, no Redisson "
                f"timer running): max {max(during, default=0):.0f} ms late",
                f"machine         load average {load1:.2f} / {load5:.2f} (1/5 min) on "
                f"{os.cpu_count()} cores, shared with other work",
            ]
        ),
        flush=True,
    )
    ok = not lost and not doubled and not early and pct(after, 0.99) <= BAR_P99_MS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
