"""Screenshots of the dashboard for the docs: ``python -m tests.browser.screenshots``.

Starts a private redis-server, runs real traffic for ``--seconds`` (a producer and a consumer
on ``orders``, a stuck ``invoices`` queue with no consumer, dead letters on ``payments``),
serves the dashboard with a short chart window so that the charts have points, and saves
``docs/img/dashboard-{main,queue,task}.png`` from headless Chromium.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

from delayq import DelayQueue
from delayq.dashboard import Settings
from delayq.embedded import EmbeddedRedis

from .support import CHROMIUM, CHROMIUM_ARGS, running

IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def traffic(url: str, stop: threading.Event) -> None:
    """Orders fall due 0.5-3 s after they are placed, at a rate that varies; one consumer."""
    producer, consumer = DelayQueue("orders", url), DelayQueue("orders", url)

    def consume() -> None:
        while not stop.is_set():
            for task in consumer.poll_many(50, timeout=0.2):
                task.ack()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    start = time.monotonic()
    while not stop.is_set():
        phase = (time.monotonic() - start) % 30
        for _ in range(3 if phase < 15 else 8):
            producer.offer({"order_id": random.randint(1000, 9999)}, delay=random.uniform(0.5, 3))
        stop.wait(0.1)
    thread.join()
    producer.close()
    consumer.close()


def seed(url: str) -> str:
    """The other queues; returns the id of a dead payment task."""
    emails = DelayQueue("emails", url)
    emails.offer_many(
        [({"to": f"u{i}@example.com", "template": "reminder"}, 3600 + 60 * i) for i in range(240)]
    )
    invoices = DelayQueue("invoices", url)
    for i in range(12):
        invoices.offer({"invoice": 500 + i}, at=time.time() - 90 + i)
    payments = DelayQueue("payments", url, max_attempts=1)
    for i in range(5):
        payments.offer(
            {"payment_id": f"pay_{i:04d}", "amount": {"value": 1999 + i, "currency": "EUR"}},
            delay=0,
            headers={"trace-id": f"4bf92f35{i:04d}", "source": "checkout"},
            key=f"pay:{i}",
        )
    dead_id = ""
    for task in payments.poll_many(5):
        dead_id = task.id
        payments.retry(task, error="card declined: insufficient funds (issuer code 51)")
    for q in (emails, invoices, payments):
        q.close()
    return dead_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="traffic before the shots")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    IMG.mkdir(parents=True, exist_ok=True)
    server = EmbeddedRedis().start()
    stop = threading.Event()
    try:
        dead_id = seed(server.url)
        producer = threading.Thread(target=traffic, args=(server.url, stop), daemon=True)
        producer.start()
        settings = Settings(redis_url=server.url, sample_interval_s=1.0, window_s=300.0, bin_s=10.0)
        with running(settings) as base, sync_playwright() as p:
            time.sleep(args.seconds)  # real traffic for the charts to show
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for path, name in (
                ("/", "main"),
                ("/q/orders?state=delayed", "queue"),
                (f"/q/payments/task?id={dead_id}", "task"),
            ):
                page.goto(base + path)
                page.screenshot(path=str(IMG / f"dashboard-{name}.png"), full_page=name != "queue")
                print("wrote", IMG / f"dashboard-{name}.png")
            browser.close()
            stop.set()
            producer.join()
    finally:
        stop.set()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
