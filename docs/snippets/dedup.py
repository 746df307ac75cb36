"""Dedup keys and caller-chosen ids: a retried or repeated offer creates no second task."""

import os

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("orders", redis=REDIS_URL)

# One live task per key: the second offer returns the first task's id (dedup="keep").
first = queue.offer({"order_id": 7}, delay=1800, key="close:7")
again = queue.offer({"order_id": 7}, delay=1800, key="close:7")
assert again == first

# Debounce: "replace" moves the pending task to the new due time and payload.
queue.offer({"order_id": 7, "reason": "edited"}, delay=3600, key="close:7", dedup="replace")
info = queue.get(first)
assert info is not None and info.payload["reason"] == "edited"

# A caller-chosen id makes an offer retried after a timeout a no-op.
queue.offer({"order_id": 8}, delay=60, id="order-8-close")
queue.offer({"order_id": 8}, delay=60, id="order-8-close")
assert queue.stats().delayed == 2  # order 7's task and order 8's, once each
queue.close()
