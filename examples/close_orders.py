"""A worker that closes unpaid orders: ``python examples/close_orders.py``.

Starts a private Redis, schedules a few close tasks (one of which fails twice before it
succeeds, one of which is rejected), runs a thread ``Worker`` until the queue is empty, and
prints what happened. The same handler shape works with ``AsyncWorker`` and ``async def``.
"""

from __future__ import annotations

import logging
import threading
import time

from delayq import Backoff, DelayQueue, Hooks, Reject, Retry, Task, Worker
from delayq.embedded import EmbeddedRedis

flaky_calls = 0


def close_order(task: Task) -> None:
    """Close an order that is still unpaid. Idempotent: closing twice is harmless."""
    global flaky_calls
    order = task.payload
    if order.get("fraud"):
        raise Reject("order flagged as fraud: a human looks at it in the dead-letter queue")
    if order.get("flaky"):
        flaky_calls += 1
        if flaky_calls < 3:
            raise Retry(delay=0.2, reason=f"payment service busy (call {flaky_calls})")
    print(f"closed order {order['order_id']} (attempt {task.attempts}, {task.lateness_ms} ms late)")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with EmbeddedRedis() as server:
        queue = DelayQueue("orders", server.url, retry_backoff=Backoff(base=0.1, max=1))
        queue.offer({"order_id": 1}, delay=0.5)
        queue.offer({"order_id": 2, "flaky": True}, delay=0.5)
        queue.offer({"order_id": 3, "fraud": True}, delay=0.5)
        queue.offer({"order_id": 4}, delay=1.0)
        dead: list[str] = []
        worker = Worker(
            queue,
            close_order,
            concurrency=4,
            hooks=Hooks(on_dead=lambda task, exc: dead.append(task.id)),
        )
        runner = threading.Thread(target=worker.run)
        runner.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stats = queue.stats()
            if stats.delayed + stats.ready + stats.inflight == 0:
                break
            time.sleep(0.1)
        worker.stop()
        runner.join()
        print("health:", worker.health().as_dict())
        for task in queue.dead():
            print(f"dead-lettered {task.id}: {task.payload} -- {task.error}")
        queue.close()


if __name__ == "__main__":
    main()
