"""A sharded queue: one logical queue over 8 sub-queues, each on its own hash tag."""

import os

from delayq import ConfigError, DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# On a cluster: redis+cluster://node1:6379,node2:6379,node3:6379 (a single Redis works too).
queue = DelayQueue("payments", redis=REDIS_URL, shards=8)

# Routed by dedup key (so dedup holds across shards), else by id: no shard is asked twice.
first = queue.offer({"order_id": 7}, delay=1800, key="close:7")
assert queue.offer({"order_id": 7}, delay=1800, key="close:7") == first  # one live task
ids = queue.offer_many([({"order_id": n}, 0) for n in range(100)])
assert queue.get(first) is not None  # found on its shard by its id alone
assert queue.cancel(first)

stats = queue.stats()  # the logical queue, and each shard's own counts in stats.shards
print(stats.ready, [shard.ready for shard in stats.shards])
assert stats.ready == 100 and len(stats.shards) == 8

# Consumers take from every shard in turn; acks go to the task's own shard.
done = 0
while done < 100:
    batch = queue.poll_many(50, timeout=2)
    assert batch, "every task comes back"
    assert all(queue.ack_many(batch))
    done += len(batch)

# The layout is recorded in Redis: a queue opened without shards= follows it (consumers,
# workers, the CLI); another count is refused, not silently split.
with DelayQueue("payments", redis=REDIS_URL) as follower:
    follower.offer({"order_id": 1}, delay=0)
    task = follower.take()
    print("follower:", follower.shards, "shards, task of", task.queue.name)
    task.ack()
other = DelayQueue("payments", redis=REDIS_URL, shards=4)
try:
    other.stats()
except ConfigError as exc:
    print("refused:", exc)
else:
    raise AssertionError("a second shard count must be refused")
finally:
    other.close()
queue.close()
