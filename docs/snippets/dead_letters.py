"""Dead letters: after max_attempts (or a reject) a task waits in the dead-letter queue."""

import os

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("payments", redis=REDIS_URL, max_attempts=1)

queue.offer({"payment": 1})
task = queue.take()
task.retry(error="RuntimeError: card processor down")  # the last attempt: dead-lettered

for dead in queue.dead(limit=10):
    print(dead.id, dead.attempts, dead.error)
assert queue.stats().dead == 1

# The processor is back: deliver every dead task again (or pass one id).
assert queue.requeue_dead() == 1
assert queue.stats().dead == 0
queue.take().ack()
queue.close()
