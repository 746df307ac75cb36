"""Durable offers: WAIT for a replica after each offer; a shortfall names the tasks."""

import contextlib
import os

from delayq import DelayQueue, Durability, NotDurable

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# This sample's Redis has no replica, so no offer can be confirmed: each raises NotDurable.
durable = Durability(replicas=1, timeout=0.2)
queue = DelayQueue("orders", redis=REDIS_URL, durability=durable)

try:
    queue.offer({"order_id": 7}, delay=1800, id="close-order-7")
except NotDurable as exc:
    print("not confirmed:", exc.task_ids)  # written on the master, not yet on a replica
    assert exc.task_ids == ["close-order-7"]

# Offering the same id again is safe: the task exists once, whatever the retries.
for _ in range(2):
    with contextlib.suppress(NotDurable):
        queue.offer({"order_id": 7}, delay=1800, id="close-order-7")
assert queue.stats().delayed == 1

# on_shortfall="warn" logs the shortfall and returns the id instead of raising.
relaxed = DelayQueue(
    "orders", redis=REDIS_URL, durability=Durability(timeout=0.2, on_shortfall="warn")
)
assert relaxed.offer({"order_id": 8}, delay=1800).created
relaxed.close()
queue.close()
