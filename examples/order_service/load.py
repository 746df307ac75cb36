"""Load the reference service and check what it promises, with one command:

    python -m examples.order_service.load --orders 100000

Creates a private PostgreSQL database (dropped at the end; ``PG_ADMIN_DSN`` names the server,
default the local one) and a private Redis (``REDIS_URL`` to use your own), starts the API
(uvicorn), the relay and the close worker as processes of their own (``--layout``), places
``--orders`` orders over HTTP at ``--rate`` per second, each with a payment window drawn from
``--window``; a
share of the customers (``--pay-share``) pay within the first third of their window. Then it
waits for every unpaid order to close, runs the reconciliation job and prints:

- every unpaid order closed once, no paid order closed, nothing left pending;
- the lateness of each close: from the order's due time to the close, on the database's clock;
- the rates of placing, paying and closing.

Exit status 0 when the bars hold (0 unpaid left open, 0 paid closed, p99 <= ``--max-p99-ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import httpx
from sqlalchemy import text

from delayq import AsyncDelayQueue
from delayq.embedded import EmbeddedRedis, free_port
from delayq.outbox import AsyncOutbox

from .db import create_schema, make_engine
from .pgtemp import TempDatabase
from .reconcile import reconcile
from .service import QUEUE


@dataclass(slots=True)
class Plan:
    orders: int
    rate: float
    window: tuple[float, float]
    pay_share: float
    concurrency: int
    seed: int


@dataclass(slots=True)
class Traffic:
    """What the clients saw."""

    placed: int = 0
    pay_replies: Counter[int] = field(default_factory=Counter)
    # Payments refused (409) because the close came first: sent after the order's due time
    # (the load fell behind its schedule), or sent before it and answered after it (the
    # deadline race every payment window has; the request waited in the server's queue).
    # Neither is a paid order closed: the payment was refused and the order stays unpaid.
    refused_in_time: int = 0
    refused_late: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    place_s: float = 0.0  # from the first order to the last one placed
    pays_s: float = 0.0  # from the first order to the last payment answered


def parse_window(value: str) -> tuple[float, float]:
    low, _, high = value.partition("-")
    try:
        window = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window is MIN-MAX seconds, not {value!r}") from None
    if not 0 < window[0] <= window[1]:
        raise argparse.ArgumentTypeError(f"--window needs 0 < MIN <= MAX, got {value!r}")
    return window


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.order_service.load",
        description="Place orders on the reference service and check every promise.",
    )
    parser.add_argument("--orders", type=int, default=100_000, help="orders to place")
    parser.add_argument("--rate", type=float, default=200.0, help="orders placed per second")
    parser.add_argument(
        "--window", type=parse_window, default=(5.0, 15.0), help="payment window, MIN-MAX s"
    )
    parser.add_argument("--pay-share", type=float, default=0.3, help="share that pays")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--max-p99-ms", type=float, default=50.0, help="bar on close lateness")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--client-nice",
        type=int,
        default=10,
        help="CPU niceness of the load generator (its clients are other machines in real life)",
    )
    parser.add_argument(
        "--layout",
        choices=("split", "processes", "lifespan"),
        default="split",
        help="relay and worker in a process each, in one process, or in the API's lifespan",
    )
    args = parser.parse_args(argv)
    if args.orders < 1 or args.rate <= 0 or args.concurrency < 1:
        parser.error("--orders, --rate and --concurrency must be positive")
    if not 0 <= args.pay_share <= 1:
        parser.error("--pay-share is between 0 and 1")
    return args


# -- the service's processes -----------------------------------------------------------------


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


@contextlib.contextmanager
def service(dsn: str, redis_url: str, prefix: str, layout: str) -> Iterator[str]:
    """The API (and, with the ``processes`` layout, the worker process); yields its URL."""
    port = free_port()
    env = {
        **os.environ,
        "ORDER_SERVICE_DSN": dsn,
        "REDIS_URL": redis_url,
        "DELAYQ_PREFIX": prefix,
        "ORDER_SERVICE_BACKGROUND": "1" if layout == "lifespan" else "0",
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for role in {"processes": ["both"], "split": ["relay", "worker"]}.get(layout, []):
            worker = subprocess.Popen(
                [sys.executable, "-m", "examples.order_service.worker", "--role", role],
                env=env,
                stdout=subprocess.PIPE,
            )
            procs.append(worker)
            line = worker.stdout.readline() if worker.stdout else b""
            if b"ready" not in line:
                raise RuntimeError(f"the {role} process did not start: {line!r}")
        api = subprocess.Popen(
            [
                sys.executable, "-m", "uvicorn", "examples.order_service.app:app",
                "--host", "127.0.0.1", "--port", str(port),
                "--no-access-log", "--log-level", "warning",
            ],
            env=env,
        )  # fmt: skip
        procs.append(api)
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url, api)
        yield url
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited with status {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/orders/0", timeout=1).status_code == 404:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the API did not answer within {timeout} s")


# -- traffic ---------------------------------------------------------------------------------


async def drive(url: str, plan: Plan) -> Traffic:
    """Place the orders at the planned rate; pay a share of them within their window.
    (aiohttp: its client costs a sixth of httpx's CPU per request, and the load shares the
    machine with the service it measures.)"""
    rng = random.Random(plan.seed)
    traffic = Traffic()
    # Payments get slots of their own: sharing the placements' would queue every payment
    # behind new orders whenever the service runs at full capacity.
    slots = asyncio.Semaphore(plan.concurrency)
    pay_slots = asyncio.Semaphore(max(1, plan.concurrency // 2))
    connector = aiohttp.TCPConnector(limit=plan.concurrency + plan.concurrency // 2)
    timeout = aiohttp.ClientTimeout(total=60)
    started = time.monotonic()
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as client:

        async def pay_later(order_id: int, due_at: float, after: float) -> None:
            await asyncio.sleep(after)
            try:
                async with pay_slots:
                    sent = time.time()  # the same host's clock as the database's
                    async with client.post(f"/orders/{order_id}/pay") as reply:
                        await reply.read()
                traffic.pay_replies[reply.status] += 1
                if reply.status == 409 and sent < due_at:
                    traffic.refused_in_time += 1
                elif reply.status == 409:
                    traffic.refused_late += 1
            except aiohttp.ClientError as exc:
                traffic.errors[f"pay: {type(exc).__name__}"] += 1

        async def place(window: float, pays: bool, pay_after: float) -> asyncio.Task[None] | None:
            try:
                async with (
                    slots,
                    client.post("/orders", json={"payment_window_s": window}) as reply,
                ):
                    reply.raise_for_status()
                    placed = await reply.json()
            except aiohttp.ClientError as exc:
                traffic.errors[f"place: {type(exc).__name__}"] += 1
                return None
            traffic.placed += 1
            if pays:
                due_at = datetime.fromisoformat(placed["due_at"]).timestamp()
                return asyncio.create_task(pay_later(placed["id"], due_at, pay_after))
            return None

        placing: list[asyncio.Task[asyncio.Task[None] | None]] = []
        for i in range(plan.orders):
            delay = started + i / plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            window = rng.uniform(*plan.window)
            pays = rng.random() < plan.pay_share
            placing.append(asyncio.create_task(place(window, pays, rng.uniform(0.1, window / 3))))
        paying = [t for t in await asyncio.gather(*placing) if t is not None]
        traffic.place_s = time.monotonic() - started
        await asyncio.gather(*paying)
        traffic.pays_s = time.monotonic() - started
    return traffic


# -- checking --------------------------------------------------------------------------------

_TOTALS = text(
    "SELECT count(*) AS placed, "
    "count(*) FILTER (WHERE status = 'paid') AS paid, "
    "count(*) FILTER (WHERE status = 'closed') AS closed, "
    "count(*) FILTER (WHERE status = 'pending') AS pending, "
    "count(*) FILTER (WHERE paid_at IS NOT NULL AND closed_at IS NOT NULL) AS paid_and_closed, "
    "count(*) FILTER (WHERE status = 'closed' AND close_deliveries > 1) AS redelivered, "
    "count(*) FILTER (WHERE closed_at < close_due_at) AS early, "
    "coalesce(sum(close_deliveries) FILTER (WHERE status = 'paid'), 0) AS to_paid "
    "FROM orders"
)
_LATENESS = text(
    "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY late) AS pct, "
    "max(late) AS worst, min(late) AS earliest, "
    "percentile_cont(0.99) WITHIN GROUP (ORDER BY late_order) AS p99_order, "
    "CAST(extract(epoch FROM max(closed_at) - min(closed_at)) AS float8) AS span_s "
    "FROM (SELECT closed_at, "
    "CAST(extract(epoch FROM closed_at - close_due_at) * 1000 AS float8) AS late, "
    "CAST(extract(epoch FROM closed_at - due_at) * 1000 AS float8) AS late_order "
    "FROM orders WHERE status = 'closed') AS c"
)


def _bucket_p99(buckets: Mapping[float, int]) -> str:
    """The bucket of the queue's delivery-lateness histogram that holds the 99th percentile:
    delayq's own part of the close lateness (the rest is the handler's transaction)."""
    total = sum(buckets.values())
    seen = 0
    for bound, count in sorted(buckets.items()):
        seen += count
        if total and seen >= 0.99 * total:
            return f"<= {bound * 1000:g} ms" if bound != float("inf") else "> 60 s"
    return "-"


async def wait_closed(engine: Any, timeout: float) -> int:
    """Wait until no order is pending past its due time and none is due any more."""
    deadline = time.monotonic() + timeout
    while True:
        async with engine.connect() as conn:
            left = (
                await conn.execute(text("SELECT count(*) FROM orders WHERE status = 'pending'"))
            ).scalar_one()
        if left == 0 or time.monotonic() > deadline:
            return int(left)
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def database(dsn: str) -> AsyncIterator[Any]:
    engine = make_engine(dsn)
    try:
        yield engine
    finally:
        await engine.dispose()


async def check(
    dsn: str, redis_url: str, prefix: str, plan: Plan, traffic: Traffic, args: argparse.Namespace
) -> bool:
    async with database(dsn) as engine:
        left = await wait_closed(engine, timeout=plan.window[1] + 60)
        async with AsyncDelayQueue(QUEUE, redis_url, prefix=prefix) as queue:
            outbox = AsyncOutbox(engine, prefix=prefix)
            found = await reconcile(engine, outbox, queue, grace=timedelta(seconds=1))
            outbox_status = await outbox.status()
            stats = await queue.stats()
        async with engine.connect() as conn:
            totals = (await conn.execute(_TOTALS)).mappings().one()
            late = (await conn.execute(_LATENESS)).mappings().one()
    p50, p99 = late["pct"] or (0.0, 0.0)
    worst = late["worst"] or 0.0
    unpaid_open = left
    paid_closed = totals["paid_and_closed"]
    rows = [
        ("orders placed", f"{totals['placed']:,} in {traffic.place_s:.1f} s "
         f"({totals['placed'] / traffic.place_s:,.0f}/s)"),
        ("paid (close task cancelled)", f"{totals['paid']:,} "
         f"({traffic.pay_replies.get(200, 0) / traffic.pays_s:,.0f}/s)"),
        ("closed by their task", f"{totals['closed']:,} "
         f"({totals['closed'] / max(late['span_s'] or 0, 1e-9):,.0f}/s)"),
        ("unpaid orders left open", f"{unpaid_open:,}"),
        ("payments refused: order already closed", f"{traffic.refused_late:,} sent after the due "
         f"time, {traffic.refused_in_time:,} sent before it and answered after it"),
        ("paid orders closed", f"{paid_closed:,}"),
        ("orders closed before their due time", f"{totals['early']:,}"),
        ("closed more than once", "0 (the close is UPDATE ... WHERE status = 'pending')"),
        ("close tasks delivered twice", f"{totals['redelivered']:,}"),
        ("close tasks delivered to paid orders", f"{totals['to_paid']:,}"),
        ("close lateness p50 / p99 / max (ms)", f"{p50:.1f} / {p99:.1f} / {worst:.1f}"),
        ("earliest close (ms after its due time)", f"{late['earliest'] or 0:.1f}"),
        ("p99 from the order's own due_at (ms)", f"{late['p99_order'] or 0:.1f}"),
        ("request errors", dict(traffic.errors) or "none"),
        ("outbox rows left (pending / dead)", f"{outbox_status.pending} / {outbox_status.dead}"),
        ("delivery lateness p99 (Redis hand-out)", _bucket_p99(stats.lateness)),
        ("redis counters", ", ".join(f"{k}={v}" for k, v in sorted(stats.counters.items()))),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(found.summary())
    ok = (
        unpaid_open == 0
        and paid_closed == 0
        and totals["early"] == 0
        and not traffic.errors
        and totals["placed"] == plan.orders
        and p99 <= args.max_p99_ms
        and not found.reoffered
    )
    print("OK" if ok else "FAILED: a bar above was not met")
    return ok


async def run_async(
    url: str, dsn: str, redis_url: str, prefix: str, args: argparse.Namespace
) -> bool:
    plan = Plan(args.orders, args.rate, args.window, args.pay_share, args.concurrency, args.seed)
    os.nice(args.client_nice)  # after the service started: its processes keep niceness 0
    traffic = await drive(url, plan)
    return await check(dsn, redis_url, prefix, plan, traffic, args)


async def prepare(dsn: str, prefix: str) -> None:
    """The tables exist before either process starts (both would create them, racing)."""
    async with database(dsn) as engine:
        await create_schema(engine)
        await AsyncOutbox(engine, prefix=prefix).install()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the with-blocks: the service's processes, Redis and the database
    # are stopped and dropped as after a normal run.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    prefix = f"os{uuid.uuid4().hex[:8]}"
    print(
        f"placing {args.orders:,} orders at {args.rate:,.0f}/s, payment windows "
        f"{args.window[0]:g}-{args.window[1]:g} s, {args.pay_share:.0%} paying; "
        f"layout: {args.layout}",
        flush=True,
    )
    with TempDatabase("order_service_load") as dsn, redis_server() as redis_url:
        asyncio.run(prepare(dsn, prefix))
        with service(dsn, redis_url, prefix, args.layout) as url:
            ok = asyncio.run(run_async(url, dsn, redis_url, prefix, args))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
