"""Stats: counts per state, read in one atomic step, and lifetime counters."""

import os

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("reports", redis=REDIS_URL)

queue.offer_many([({"day": day}, 3600 * day) for day in range(1, 8)])  # one round trip
queue.offer({"day": 0})

stats = queue.stats()
print(f"delayed={stats.delayed} ready={stats.ready} inflight={stats.inflight} dead={stats.dead}")
print("next due at", stats.next_due_at, "| counters", dict(stats.counters))
assert (stats.delayed, stats.ready, stats.total) == (7, 1, 8)
queue.close()
