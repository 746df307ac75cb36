"""Quick start: schedule, cancel, take and ack (sync)."""

import os
from datetime import timedelta

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

queue = DelayQueue("orders", redis=REDIS_URL)

# Producer: close order 42 in 30 minutes unless it is paid first.
close_42 = queue.offer({"order_id": 42}, delay=timedelta(minutes=30), key="close:42")
# ... the customer pays: the close task goes away.
assert queue.cancel(close_42) is True

# Order 43 is never paid: its close task falls due in one second.
queue.offer({"order_id": 43}, delay=1, key="close:43")

# Consumer: block until a task is due, handle it, ack it.
task = queue.take()
print(f"closing order {task.payload['order_id']}, {task.lateness_ms} ms after its due time")
task.ack()
queue.close()
