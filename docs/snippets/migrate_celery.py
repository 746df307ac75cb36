"""delayq for a Celery user: apply_async(countdown=...) becomes offer(delay=...)."""

import os
import threading
from datetime import UTC, datetime, timedelta

from delayq import DelayQueue, Retry, Task, Worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
closed: list[int] = []

# --8<-- [start:usage]
queue = DelayQueue("orders", redis=REDIS_URL)


def close_order(task: Task) -> None:  # the arguments are task.payload
    order_id = task.payload["order_id"]
    if order_id < 0:
        raise Retry(delay=60)  # Celery: self.retry(countdown=60)
    closed.append(order_id)  # returning acks (like acks_late=True)


# close_order.apply_async(args=[42], countdown=1800)
task_id = queue.offer({"order_id": 42}, delay=1800)
# close_order.apply_async(args=[43], eta=when)
when = datetime.now(UTC) + timedelta(hours=2)
queue.offer({"order_id": 43}, at=when)
# AsyncResult(task_id).revoke(): delayq removes the waiting task itself
queue.cancel(task_id)
# celery -A app worker  ->  delayq worker app:close_order -q orders, or:
worker = Worker(queue, close_order, concurrency=8)
# --8<-- [end:usage]

# The check: one task is left two hours out; a task due now is closed by the worker.
assert queue.get(task_id) is None and queue.stats().delayed == 1
queue.offer({"order_id": 44})
runner = threading.Thread(target=worker.run)
runner.start()
deadline = datetime.now(UTC) + timedelta(seconds=10)
while not closed and datetime.now(UTC) < deadline:
    threading.Event().wait(0.05)
worker.stop()
runner.join()
assert closed == [44], closed
queue.close()
