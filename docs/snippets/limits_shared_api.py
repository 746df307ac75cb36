"""One downstream API shared by several kinds of work: give them one limit key on one queue,
so every worker process counts against the same 50 requests per second."""

import os
import time

from delayq import DelayQueue, Limit, Offer

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --8<-- [start:shared]
queue = DelayQueue("crm-sync", redis=REDIS_URL)
queue.limits.set("crm-api", Limit(rate=50, per=1.0, burst=10))  # the CRM allows 50/s

# contacts and deals both call the CRM: both carry its limit key
queue.offer_many([Offer({"kind": "contact", "id": i}, limit_key="crm-api") for i in range(30)])
queue.offer_many([Offer({"kind": "deal", "id": i}, limit_key="crm-api") for i in range(30)])

started, done = time.monotonic(), 0
while done < 60:
    for task in queue.poll_many(20, timeout=1):  # any number of such loops, anywhere
        task.ack()
        done += 1
print(f"60 calls in {time.monotonic() - started:.2f} s: 10 at once, then 50/s")
# --8<-- [end:shared]
queue.close()
