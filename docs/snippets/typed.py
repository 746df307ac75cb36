"""Typed payloads: a dataclass goes in and comes back as itself."""

import os
from dataclasses import dataclass

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class CloseOrder:
    order_id: int
    reason: str = "unpaid"


queue = DelayQueue("typed-orders", redis=REDIS_URL, payload_type=CloseOrder)
queue.offer(CloseOrder(42), delay=0.1)
task = queue.take()
assert isinstance(task.payload, CloseOrder)
print(task.payload)
task.ack()
queue.close()
