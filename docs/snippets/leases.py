"""Leases: a delivered task is leased for the visibility timeout; extend it or lose it."""

import os

from delayq import DelayQueue, LeaseLost

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("exports", redis=REDIS_URL, visibility_timeout=1)

queue.offer({"report": "march"})
task = queue.take()
assert task.attempts == 1
task.extend(5)  # a long job keeps its lease (a Worker does this by itself)
task.ack()

# A consumer that stalls past its lease: the task is delivered again, with attempts + 1,
# and the stale consumer can no longer touch it.
queue.offer({"report": "april"})
stale = queue.take()
again = queue.poll(timeout=10)  # the lease runs out after 1 s; then backoff
assert again is not None and again.id == stale.id and again.attempts == 2
try:
    stale.ack()
except LeaseLost:
    print("the stale consumer's ack was refused: the task is someone else's now")
again.ack()
queue.close()
