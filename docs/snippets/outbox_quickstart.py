"""The outbox's first steps (docs/outbox.md): offer and cancel in the order's transaction,
a relay moving committed rows into the queue, and the same from asyncio."""

import asyncio  # noqa: I001 (the docs show the sections below as they are)
import os
import time

from pgsample import temp_database

# --8<-- [start:sync]
import psycopg

from delayq import DelayQueue
from delayq.outbox import AsyncOutbox, AsyncRelay, Outbox, Relay

# --8<-- [end:sync]
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
dsn = temp_database()  # postgresql://…, this sample's own database, dropped at exit
with psycopg.connect(dsn) as setup:
    setup.execute("CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)")
queue = DelayQueue("orders", redis=REDIS_URL)

# --8<-- [start:offer]
outbox = Outbox(dsn)  # or a psycopg_pool.ConnectionPool, or a SQLAlchemy Engine
outbox.install()  # idempotent; or `delayq outbox install --dsn ...`

with psycopg.connect(dsn) as conn, conn.transaction():
    conn.execute("INSERT INTO orders (id, status) VALUES (42, 'pending')")
    tid = outbox.offer(conn, "orders", {"order_id": 42}, delay=1800, key="close:42")
# --8<-- [end:offer]

# --8<-- [start:relay]
relay = Relay(dsn, REDIS_URL).start()  # a background thread; or `delayq relay --dsn ...`
# --8<-- [end:relay]
deadline = time.monotonic() + 10
while queue.get(tid) is None:  # committed: in Redis within milliseconds
    assert time.monotonic() < deadline, "the relay never moved the task"
    time.sleep(0.01)

# --8<-- [start:cancel]
with psycopg.connect(dsn) as conn, conn.transaction():
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 42")
    outbox.cancel(conn, "orders", tid)  # also transactional; and outbox.reschedule(...)
# --8<-- [end:cancel]
deadline = time.monotonic() + 10
while queue.get(tid) is not None:
    assert time.monotonic() < deadline, "the cancel never reached Redis"
    time.sleep(0.01)
relay.stop()


# --8<-- [start:async]
async def main() -> None:
    outbox = AsyncOutbox(dsn)  # or an AsyncEngine (postgresql+psycopg://...)
    relay = AsyncRelay(dsn, REDIS_URL)
    await outbox.install()
    running = asyncio.create_task(relay.run())  # e.g. in a FastAPI lifespan
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute("INSERT INTO orders (id, status) VALUES (43, 'pending')")
        task_id = await outbox.offer(conn, "orders", {"order_id": 43}, 1800, key="close:43")
    while queue.get(task_id) is None:
        await asyncio.sleep(0.01)
    relay.stop()  # finishes the batch in hand
    await running


# --8<-- [end:async]
asyncio.run(asyncio.wait_for(main(), 30))
queue.close()
print("ok")
