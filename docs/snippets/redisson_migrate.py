"""The way off Redisson from Python: offer in Redisson's format, then migrate into delayq."""

import os

from delayq import DelayQueue
from delayq.redisson import Migration, RedissonDelayedQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --8<-- [start:offer]
# Python offers to Java consumers still on Redisson (codec as on the Java side):
# RDelayedQueue<OrderTimeout> delayed = redisson.getDelayedQueue(
#     redisson.getBlockingQueue("orders", new JsonJacksonCodec()));
with RedissonDelayedQueue("orders", REDIS_URL, codec="json-jackson") as java_queue:
    java_queue.offer({"orderId": 42}, delay=1800, java_class="com.shop.OrderTimeout")
    java_queue.offer({"orderId": 43}, delay=0.5, java_class="com.shop.OrderTimeout")
# --8<-- [end:offer]

# --8<-- [start:migrate]
# The delayq queue named like the Redisson one shares its slot: atomic batches.
with Migration("orders", to="orders", redis=REDIS_URL, codec="json-jackson") as migration:
    backlog, counts, first = migration.preview()  # the dry run: changes nothing
    print(f"{backlog.pending} delayed, {backlog.ready} ready, formats {counts.by_format}")
    summary = migration.run()  # run(follow=True, stop=...) keeps moving new offers
    print(summary.text())

queue = DelayQueue("orders", redis=REDIS_URL)
task = queue.take()  # order 43, at the due time Redisson's offer gave it
print(task.payload, task.headers)  # {"redisson-class": "com.shop.OrderTimeout"}
task.ack()
# --8<-- [end:migrate]

assert task.payload == {"orderId": 43}
assert task.headers == {"redisson-class": "com.shop.OrderTimeout"}
assert queue.stats().delayed == 1  # order 42, still 30 minutes out
queue.close()
