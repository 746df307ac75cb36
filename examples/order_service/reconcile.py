"""The safety net of the source articles, as a small job: orders still pending well past
their due time are checked for a live close task, and the ones without are offered again.

With the outbox this should find nothing (a committed order always has its task), and it
says so; it is the net for what no code can rule out (a task purged by hand, Redis restored
from an old backup). Run it periodically:
``python -m examples.order_service.reconcile --dsn … --redis …``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from delayq import AsyncDelayQueue, TaskState
from delayq.outbox import AsyncOutbox

from .db import make_engine, orders
from .service import QUEUE, close_key, close_task_id

_LIVE = (TaskState.DELAYED, TaskState.READY, TaskState.INFLIGHT)


@dataclass(slots=True)
class Reconciliation:
    """What one run found."""

    overdue: int = 0  # pending orders past their due time by more than the grace
    live: int = 0  # ... whose close task is still on its way (in Redis or in the outbox)
    dead: int = 0  # ... whose close task was dead-lettered (look at the handler's error)
    reoffered: list[int] = field(default_factory=list)  # ... with no task: offered again

    def summary(self) -> str:
        if not self.overdue:
            return "reconciliation: no order is pending past its due time; nothing to do"
        return (
            f"reconciliation: {self.overdue} orders pending past their due time: "
            f"{self.live} with their close task on its way, {self.dead} dead-lettered, "
            f"{len(self.reoffered)} without a task (offered again: {self.reoffered[:10]})"
        )


async def reconcile(
    engine: AsyncEngine,
    outbox: AsyncOutbox,
    queue: AsyncDelayQueue,
    *,
    grace: timedelta = timedelta(seconds=30),
    limit: int = 10_000,
) -> Reconciliation:
    """Check orders pending for longer than ``grace`` past their due time (a backlog the
    worker is still draining is not a loss, so the grace should exceed normal lateness)."""
    found = Reconciliation()
    async with engine.connect() as conn:
        overdue = (
            await conn.execute(
                select(orders.c.id)
                .where(orders.c.status == "pending", orders.c.due_at < func.now() - grace)
                .order_by(orders.c.due_at)
                .limit(limit)
            )
        ).all()
    found.overdue = len(overdue)
    for (order_id,) in overdue:
        task_id = close_task_id(order_id)
        info = await queue.get(task_id)
        if (info is not None and info.state in _LIVE) or await _in_outbox(engine, outbox, task_id):
            found.live += 1
        elif info is not None and info.state is TaskState.DEAD:
            found.dead += 1
        elif await _offer_again(engine, outbox, order_id):
            found.reoffered.append(order_id)
    return found


async def _in_outbox(engine: AsyncEngine, outbox: AsyncOutbox, task_id: str) -> bool:
    """Whether a row for the task still waits for a relay."""
    table = f'"{outbox.schema}"."{outbox.table}"' if outbox.schema else f'"{outbox.table}"'
    async with engine.connect() as conn:
        sql = text(f"SELECT 1 FROM {table} WHERE task_id = :id AND status = 'pending' LIMIT 1")
        return (await conn.execute(sql, {"id": task_id})).first() is not None


async def _offer_again(engine: AsyncEngine, outbox: AsyncOutbox, order_id: int) -> bool:
    """A new close task, due now, for an order that is still pending (checked under a row
    lock, so a payment that lands meanwhile wins)."""
    async with engine.begin() as conn:
        still_pending = (
            await conn.execute(
                select(orders.c.id)
                .where(orders.c.id == order_id, orders.c.status == "pending")
                .with_for_update()
            )
        ).first()
        if still_pending is None:
            return False
        await outbox.offer(
            conn, QUEUE, {"order_id": order_id}, delay=0,
            id=close_task_id(order_id), key=close_key(order_id),
        )  # fmt: skip
    return True


async def _main(args: argparse.Namespace) -> None:
    engine = make_engine(args.dsn)
    try:
        async with AsyncDelayQueue(QUEUE, args.redis, prefix=args.prefix) as queue:
            outbox = AsyncOutbox(engine, prefix=args.prefix)
            result = await reconcile(engine, outbox, queue, grace=timedelta(seconds=args.grace))
        print(result.summary())
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("ORDER_SERVICE_DSN"), required=False)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--prefix", default=os.environ.get("DELAYQ_PREFIX", "dq"))
    parser.add_argument("--grace", type=float, default=30.0, help="seconds past the due time")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or ORDER_SERVICE_DSN) is required")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
