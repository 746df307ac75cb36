"""The outbox with SQLAlchemy 2 (docs/sqlalchemy.md): Session, Connection and AsyncSession."""

import asyncio
import os
import time

from pgsample import temp_database

# --8<-- [start:imports]
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

# --8<-- [end:imports]
from delayq import DelayQueue
from delayq.outbox import AsyncOutbox, Outbox, Relay

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
DSN = temp_database()  # postgresql://…, this sample's own database, dropped at exit
queue = DelayQueue("orders", redis=REDIS_URL)


def in_redis(task_id: str) -> bool:
    """Whether the relay has moved the task to Redis yet (within milliseconds)."""
    deadline = time.monotonic() + 10
    while queue.get(task_id) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --8<-- [start:setup]
engine = create_engine(DSN.replace("postgresql://", "postgresql+psycopg://"))
outbox = Outbox(engine)  # the engine serves install(), status() and dead() only
outbox.install()  # the table, its indexes and its NOTIFY trigger; idempotent
relay = Relay(DSN, REDIS_URL).start()  # or `delayq relay`, in a process of its own
# --8<-- [end:setup]
with engine.begin() as conn:
    conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, status text NOT NULL)"))

# --8<-- [start:session]
with Session(engine) as session, session.begin():
    order_id = session.execute(
        text("INSERT INTO orders (status) VALUES ('pending') RETURNING id")
    ).scalar_one()
    task_id = outbox.offer(
        session, "orders", {"order_id": order_id}, delay=1800, key=f"close:{order_id}"
    )
# Committed: the relay, woken by the commit's NOTIFY, puts the task in Redis.
# --8<-- [end:session]
assert in_redis(task_id)

# --8<-- [start:rollback]
try:
    with Session(engine) as session, session.begin():
        session.execute(text("INSERT INTO orders (status) VALUES ('pending')"))
        ghost = outbox.offer(session, "orders", {"order_id": -1}, delay=1800)
        raise RuntimeError("the payment provider is down")  # the transaction rolls back
except RuntimeError:
    pass
# Neither the order nor its task exists; the relay never sees the row.
# --8<-- [end:rollback]

# --8<-- [start:cancel]
with engine.begin() as conn:  # a Connection works as well as a Session
    conn.execute(text("UPDATE orders SET status = 'paid' WHERE id = :id"), {"id": order_id})
    outbox.cancel(conn, "orders", task_id)  # on commit; offer + cancel always ends with none
# --8<-- [end:cancel]
deadline = time.monotonic() + 10
while queue.get(task_id) is not None and time.monotonic() < deadline:
    time.sleep(0.01)
assert queue.get(task_id) is None and queue.get(ghost) is None

# --8<-- [start:savepoint]
with Session(engine) as session, session.begin():
    kept = outbox.offer(session, "orders", {"order_id": 1}, delay=60)
    try:
        with session.begin_nested():  # a SAVEPOINT
            dropped = outbox.offer(session, "orders", {"order_id": 2}, delay=60)
            raise ValueError("this part fails")
    except ValueError:
        pass  # rolled back to the savepoint: `dropped` is gone, `kept` commits
# --8<-- [end:savepoint]
assert in_redis(kept) and queue.get(dropped) is None


# --8<-- [start:async]
async def place_order() -> str:
    async_engine = create_async_engine(DSN.replace("postgresql://", "postgresql+psycopg://"))
    async_outbox = AsyncOutbox(async_engine)
    async with AsyncSession(async_engine) as session, session.begin():
        order_id = (
            await session.execute(
                text("INSERT INTO orders (status) VALUES ('pending') RETURNING id")
            )
        ).scalar_one()
        task_id = await async_outbox.offer(
            session, "orders", {"order_id": order_id}, delay=1800, key=f"close:{order_id}"
        )
    await async_engine.dispose()
    return task_id


# --8<-- [end:async]


async_task = asyncio.run(place_order())
assert in_redis(async_task)
print(outbox.status())
relay.stop()
queue.close()
engine.dispose()
