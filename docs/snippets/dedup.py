"""Dedup keys and caller-chosen ids: a retried or repeated offer creates no second task."""

import os

from delayq import DelayQueue, TaskIdConflict

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("orders", redis=REDIS_URL)

# One live task per key: the second offer returns the first task's id (dedup="keep").
first = queue.offer({"order_id": 7}, delay=1800, key="close:7")
again = queue.offer({"order_id": 7}, delay=1800, key="close:7")
assert again == first
print(first.outcome, again.outcome)  # created existing: the id says what the offer did

# Debounce: "replace" moves the pending task to the new due time and payload.
moved = queue.offer({"order_id": 7, "note": "edited"}, delay=3600, key="close:7", dedup="replace")
info = queue.get(first)
assert moved.outcome == "replaced" and info is not None and info.payload["note"] == "edited"

# A caller-chosen id makes an offer retried after a timeout a no-op ...
assert queue.offer({"order_id": 8}, delay=60, id="order-8-close").created
assert not queue.offer({"order_id": 8}, delay=60, id="order-8-close").created
# ... and the same id with other content is refused, not silently ignored.
try:
    queue.offer({"order_id": 9}, delay=60, id="order-8-close")
except TaskIdConflict as exc:
    print("refused:", exc)
assert queue.stats().delayed == 2  # order 7's task and order 8's, once each
queue.close()
