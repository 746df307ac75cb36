"""Per-tenant limits: each tenant's tasks run at most 2 at once (the default), a big tenant
gets 5, and an over-limit task waits in Redis, not in a retry loop."""

import os

from delayq import DelayQueue, Limit, Offer

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("reports", redis=REDIS_URL)

# --8<-- [start:tenants]
queue.limits.set(queue.limits.DEFAULT, Limit(concurrency=2))  # every tenant without its own
queue.limits.set("tenant:acme", Limit(concurrency=5))

queue.offer_many([Offer({"report": i}, limit_key="tenant:acme") for i in range(8)])
queue.offer_many([Offer({"report": i}, limit_key="tenant:tiny") for i in range(3)])

leased = queue.poll_many(50, timeout=1)  # 5 of acme's, 2 of tiny's: the rest wait their turn
for row in queue.limits.list():
    print(f"{row.key:12} running={row.running} waiting={row.waiting} limit of {row.limit_of}")
# --8<-- [end:tenants]
assert len(leased) == 7
for task in leased:
    task.ack()  # each ack frees its slot and lets the next of that tenant in
assert len(queue.poll_many(50, timeout=1)) == 4
queue.close()
