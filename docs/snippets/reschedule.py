"""Look a task up by id, move it, cancel it."""

import os
from datetime import UTC, datetime, timedelta

from delayq import DelayQueue, TaskState

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("receipts", redis=REDIS_URL)

# Confirm receipt 7 days after delivery, at a given instant (an aware datetime).
delivered = datetime.now(UTC)
task_id = queue.offer({"parcel": "P-1"}, at=delivered + timedelta(days=7))

info = queue.get(task_id)
assert info is not None and info.state is TaskState.DELAYED
print("due at", info.due_at)

# The customer confirmed early: run it in one hour instead, or not at all.
assert queue.reschedule(task_id, delay=timedelta(hours=1)) is True
assert queue.cancel(task_id) is True
assert queue.get(task_id) is None
assert queue.cancel(task_id) is False  # only a waiting task can be cancelled
queue.close()
