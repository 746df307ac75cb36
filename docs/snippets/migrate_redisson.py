"""delayq for a Redisson user: RDelayedQueue.offer + RBlockingQueue.take, with acks."""

import os
from datetime import timedelta

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --8<-- [start:usage]
# RBlockingQueue<String> target = redisson.getBlockingQueue("orders");
# RDelayedQueue<String> delayed = redisson.getDelayedQueue(target);
queue = DelayQueue("orders", redis=REDIS_URL)  # both parts in one object

# delayed.offer("order-42", 30, TimeUnit.MINUTES);
queue.offer({"order_id": 42}, delay=timedelta(minutes=30), key="close:42")
# delayed.offer("order-43", 1, TimeUnit.SECONDS);
queue.offer({"order_id": 43}, delay=1)

# String order = target.take();      -> the task is leased to you, not removed
task = queue.take()
print("closing order", task.payload["order_id"])
task.ack()  # done: only now is it gone (Redisson has no ack)

# String order = target.poll(5, TimeUnit.SECONDS);  -> None after 5 s
nothing = queue.poll(timeout=0.5)
# --8<-- [end:usage]

assert task.payload == {"order_id": 43} and nothing is None
assert queue.stats().delayed == 1  # order 42, still 30 minutes out
queue.close()
