"""delayq for an RQ user: enqueue_in / enqueue_at become offer(delay=...) / offer(at=...)."""

import os
from datetime import UTC, datetime, timedelta

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --8<-- [start:usage]
queue = DelayQueue("emails", redis=REDIS_URL)

# q.enqueue_in(timedelta(minutes=10), send_reminder, "ada@example.com")
reminder = queue.offer({"to": "ada@example.com"}, delay=timedelta(minutes=10))
# q.enqueue_at(datetime(2030, 1, 1, tzinfo=UTC), send_newsletter)
queue.offer({"newsletter": "2030-01"}, at=datetime(2030, 1, 1, tzinfo=UTC))
# job.cancel()                      -> only a task still waiting can be cancelled
queue.cancel(reminder)
# Job(id).get_status()              -> state, due time, attempts, last error
info = queue.get(reminder)  # None: cancelled
# --8<-- [end:usage]

assert info is None and queue.stats().delayed == 1
queue.close()
