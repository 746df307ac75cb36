"""At-least-once: a handler may see a task twice, so it checks state before acting."""

import os

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("orders", redis=REDIS_URL, visibility_timeout=0.5)
orders = {42: "unpaid"}  # your database


def close_if_unpaid(order_id: int) -> None:
    # Idempotent: a paid or already closed order is left alone, so running twice is harmless.
    if orders[order_id] == "unpaid":
        orders[order_id] = "closed"


queue.offer({"order_id": 42})
first = queue.take()
close_if_unpaid(first.payload["order_id"])
# ... the consumer crashes here, before ack: the lease runs out and the task comes back.
second = queue.poll(timeout=10)
assert second is not None and second.id == first.id
close_if_unpaid(second.payload["order_id"])  # a no-op the second time
second.ack()
assert orders == {42: "closed"}
queue.close()
