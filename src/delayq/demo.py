"""The order-timeout demo: ``python -m delayq.demo`` (or ``make demo``).

A shop places orders; each order schedules a "close if still unpaid" task a few seconds out.
Customers pay some orders in time, which cancels their close task. Consumer threads close the
rest at their due time. At the end: how many were closed and cancelled, none lost or closed
twice, and how late each close ran (handler start minus due time).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import DelayqError, DelayQueue
from ._core.text import printable
from .embedded import EmbeddedRedis


@dataclass
class Shop:
    """The demo's stand-in for an orders table."""

    orders: int
    paid: set[int]
    closed: dict[int, int]  # order id -> times closed (must end at 1)
    lateness_ms: list[float]
    lock: threading.Lock


def consume(queue: DelayQueue, shop: Shop, stop: threading.Event) -> None:
    while not stop.is_set():
        task = queue.poll(timeout=0.2)
        if task is None:
            continue
        started_ms = time.time() * 1000
        order_id = task.payload["order_id"]
        with shop.lock:
            # Idempotent handler: a paid order is never closed, a closed one not twice.
            if order_id not in shop.paid:
                shop.closed[order_id] = shop.closed.get(order_id, 0) + 1
                shop.lateness_ms.append(started_ms - task.due_ms)
        task.ack()


def run(redis_url: str, orders: int, consumers: int, spread_s: float, console: Console) -> bool:
    name = f"demo-orders-{uuid.uuid4().hex[:6]}"
    queue = DelayQueue(name, redis_url, visibility_timeout=10)
    queue.ping()  # an unreachable Redis stops the demo here, before its threads start
    shop = Shop(orders, set(), {}, [], threading.Lock())
    stop = threading.Event()
    consumer_queues = [DelayQueue(name, redis_url) for _ in range(consumers)]
    workers = [threading.Thread(target=consume, args=(q, shop, stop)) for q in consumer_queues]
    for w in workers:
        w.start()

    rng = random.Random(7)
    close_ids: dict[int, str] = {}
    placed_at = time.monotonic()
    payments = []  # (when, order id): a third of the customers pay before their deadline
    for order_id in range(orders):
        delay = rng.uniform(1.0, 1.0 + spread_s)
        close_ids[order_id] = queue.offer(
            {"order_id": order_id, "amount": rng.randint(5, 500)},
            delay=delay,
            key=f"close:{order_id}",
        )
        if rng.random() < 1 / 3:
            payments.append((placed_at + rng.uniform(0.1, delay - 0.2), order_id))
    payments.sort()
    console.print(
        f"placed [bold]{orders}[/] orders on queue [cyan]{name}[/]; each closes "
        f"1-{1 + spread_s:.0f} s later unless paid; {len(payments)} customers will pay"
    )

    paid_in_time = 0
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        settled = progress.add_task("orders settled", total=orders)

        def show() -> None:
            progress.update(
                settled,
                completed=len(shop.closed) + paid_in_time,
                description=f"closed {len(shop.closed):>4} | paid {paid_in_time:>4} |",
            )

        for when, order_id in payments:
            while (pause := when - time.monotonic()) > 0:
                time.sleep(min(pause, 0.1))
                show()
            with shop.lock:
                if order_id in shop.closed:
                    continue  # too late: already closed, payment refused
                shop.paid.add(order_id)
            if queue.cancel(close_ids[order_id]):
                paid_in_time += 1
            show()
        deadline = time.monotonic() + spread_s + 15
        while time.monotonic() < deadline:
            stats = queue.stats()
            show()
            if stats.delayed + stats.ready + stats.inflight == 0:
                break
            time.sleep(0.1)
        show()

    stop.set()
    for w in workers:
        w.join()
    for q in consumer_queues:
        q.close()
    stats = queue.stats()
    queue.close()

    closed = len(shop.closed)
    twice = sum(1 for n in shop.closed.values() if n > 1)
    lost = orders - closed - len(shop.paid)
    late = sorted(shop.lateness_ms)
    table = Table(title="order-timeout demo")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("orders placed", str(orders))
    table.add_row("paid in time (close task cancelled)", str(paid_in_time))
    table.add_row("closed at their due time (delivered)", str(closed))
    table.add_row("closed twice", str(twice))
    table.add_row("lost (neither paid nor closed)", str(lost))
    if late:
        table.add_row("lateness p50 (ms)", f"{statistics.median(late):.2f}")
        table.add_row("lateness p99 (ms)", f"{late[min(len(late) - 1, int(len(late) * 0.99))]:.2f}")
        table.add_row("lateness max (ms)", f"{late[-1]:.2f}")
    table.add_row(
        "redis counters", ", ".join(f"{k}={v}" for k, v in sorted(stats.counters.items()))
    )
    console.print(table)
    ok = twice == 0 and lost == 0 and closed + len(shop.paid) == orders
    console.print("[bold green]OK[/]" if ok else "[bold red]MISMATCH[/]")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL"), help="Redis URL")
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument(
        "--spread", type=float, default=5.0, help="seconds over which orders fall due"
    )
    args = parser.parse_args(argv)
    console = Console()
    try:
        if args.redis:
            return 0 if run(args.redis, args.orders, args.consumers, args.spread, console) else 1
        with EmbeddedRedis() as server:
            console.print(f"started embedded redis-server {server.version} on port {server.port}")
            return 0 if run(server.url, args.orders, args.consumers, args.spread, console) else 1
    except DelayqError as exc:  # no redis-server, a wrong URL, Redis away: one line, no trace
        print(f"error: {printable(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
