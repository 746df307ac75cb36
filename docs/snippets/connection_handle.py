"""One connection handle per Redis: its queues share its pools and pub/sub connections."""

import asyncio
import os
import time

import delayq

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# Any URL form (Sentinel, Cluster); reconnect_timeout is the budget of every queue on it.
with delayq.connect(REDIS_URL, reconnect_timeout=15) as conn:
    orders = conn.queue("orders", visibility_timeout=60)
    emails = conn.queue("emails", shards=4, create=True)  # 4 shards, the same connections
    orders.offer({"order_id": 1}, delay=1800)
    emails.offer_many([({"to": f"user{n}@example.com"}, 0) for n in range(10)])

    # A worker on both queues: the channels of all five (sub-)queues on one pub/sub
    # connection, and every call through the handle's pool.
    sent: list[str] = []
    worker = delayq.Worker([orders, emails], lambda task: sent.append(task.payload["to"]))
    with worker.start_background():
        deadline = time.monotonic() + 10
        while len(sent) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        print("emails sent:", len(sent), "- pub/sub connections:", conn.subscriber.connections)

    print("registered:", conn.queues())  # the registry: valid names only, sorted
    for stats in conn.stats():  # every queue's stats, in one round trip per Redis node
        shards = len(stats.shards) or 1
        print(f"{stats.queue}: {stats.delayed} delayed, {stats.ready} ready, {shards} shard(s)")
# Leaving the block closed the handle and its queues (a call on them raises QueueClosed).


async def main() -> None:
    # The asyncio twin: async with, and await on every call that reaches Redis.
    async with delayq.aconnect(REDIS_URL) as conn:
        orders = conn.queue("orders")
        await orders.offer({"order_id": 2}, delay=1800)
        print("asyncio:", [(s.queue, s.delayed) for s in await conn.stats(["orders"])])


asyncio.run(main())
