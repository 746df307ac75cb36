"""A consumer loop without a worker: one round trip per task, and the consume() iterator."""

import os

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("receipts", redis=REDIS_URL)
queue.offer_many([({"order_id": n}, 0) for n in range(1, 101)])

# The loop Redisson users write. Each ack also fetches the next due tasks (up to
# fetch_ahead=8) in its own round trip, so the next take() costs none.
for _ in range(50):
    task = queue.take()
    task.ack()  # raises LeaseLost if the lease ran out meanwhile, as before
print("after 50 acks:", queue.stats().inflight, "task(s) fetched ahead, leased to this consumer")

# The same loop as an iterator: each task is acked when the next is asked for. Leaving the
# with-block acks the task in hand on a break, retries it on an exception, and hands the
# tasks fetched ahead back at once.
with queue.consume() as tasks:
    for task in tasks:
        if task.payload["order_id"] == 80:
            break
stats = queue.stats()
print(
    "after the break:",
    stats.counters["acked"],
    "acked,",
    stats.ready,
    "ready,",
    stats.inflight,
    "leased",
)
queue.close()
