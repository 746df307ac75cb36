"""Recurring schedules: each process upserts them at start (the same spec is a no-op), and an
ordinary worker handles their fires; there is no scheduler process."""

import os
import threading
from datetime import timedelta

from delayq import DelayQueue, Task, Worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --8<-- [start:upsert]
queue = DelayQueue("maintenance", redis=REDIS_URL)

# The safety-net scan for unclosed orders, every 5 minutes on the clock (00:00, 00:05, ...).
queue.schedules.upsert("unclosed-orders", {"scan": "unclosed"}, every=timedelta(minutes=5))
# A report at 09:00 Berlin time on working days; after an outage longer than an hour it is
# skipped (and counted), not run late.
queue.schedules.upsert(
    "backlog-report",
    {"report": "backlog"},
    cron="0 9 * * 1-5",
    tz="Europe/Berlin",
    catchup_window=timedelta(hours=1),
)
# Every second, for this demo; a fire still running makes the next one skip (the default).
queue.schedules.upsert("heartbeat", {"ping": True}, every=1)
# --8<-- [end:upsert]

# --8<-- [start:handle]
fired = threading.Event()


def handle(task: Task) -> None:
    if task.schedule == "heartbeat":
        print(f"{task.id}: {task.schedule} of {task.fire_time:%H:%M:%S}")
        fired.set()


worker = Worker(queue, handle, concurrency=4)
background = worker.start_background()
# --8<-- [end:handle]
assert fired.wait(10)
background.stop()

# --8<-- [start:inspect]
info = queue.schedules.get("backlog-report")
assert info is not None
print(info.schedule.explain(), "| version", info.version)
for moment in info.next_fires[:3]:
    print(" ", moment.isoformat())
again = queue.schedules.upsert(
    "backlog-report",
    {"report": "backlog"},
    cron="0 9 * * 1-5",
    tz="Europe/Berlin",
    catchup_window=timedelta(hours=1),
)
print("changed:", again.changed, "| version", again.version)  # the same spec: a no-op
# --8<-- [end:inspect]
queue.close()
