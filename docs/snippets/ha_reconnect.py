"""reconnect_timeout: how long a call rides out a failover before RedisUnavailable."""

import os

from delayq import DelayQueue, RedisUnavailable

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Sentinel with down-after-milliseconds 5000: detection 5 s + the election, plus margin.
queue = DelayQueue("orders", redis=REDIS_URL, reconnect_timeout=15)


def schedule_close(order_id: int) -> bool:
    """Schedule an order's timeout; False if Redis had no master for 15 s."""
    try:
        # A caller-chosen id makes the retry of a call that timed out a no-op.
        queue.offer({"order_id": order_id}, delay=1800, id=f"close-order-{order_id}")
    except RedisUnavailable:
        return False  # e.g. answer 503 and let the client retry: the same id, no duplicate
    return True


assert schedule_close(7) and schedule_close(7)  # twice, one task
assert queue.stats().delayed == 1
queue.close()
