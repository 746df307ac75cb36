"""The order rules, each one database transaction: place (with its close task), pay (and
cancel that task), and close an order that is still unpaid (the close task's handler)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from delayq.outbox import AsyncOutbox

from .db import orders

QUEUE = "orders"


def close_task_id(order_id: int) -> str:
    """The close task's delayq id, chosen by the service: pay and the reconciliation job
    find the task from the order alone, and an offer repeated under it is a no-op."""
    return f"close-{order_id}"


def close_key(order_id: int) -> str:
    """The close task's dedup key: one live close task per order, however often it is
    offered (a retried request, the reconciliation job)."""
    return f"close:{order_id}"


@dataclass(frozen=True, slots=True)
class PlacedOrder:
    id: int
    close_task_id: str
    due_at: datetime


class PayResult(StrEnum):
    PAID = "paid"
    ALREADY_PAID = "already_paid"
    CLOSED = "closed"  # too late: the close task got there first
    NOT_FOUND = "not_found"


async def place_order(
    session: AsyncSession, outbox: AsyncOutbox, payment_window: timedelta
) -> PlacedOrder:
    """Insert the order and its close task in the session's transaction: both commit, or
    neither does. The caller commits."""
    order_id, due_at = (
        await session.execute(
            insert(orders)
            .values(due_at=func.clock_timestamp() + payment_window)
            .returning(orders.c.id, orders.c.due_at)
        )
    ).one()
    task_id = await outbox.offer(
        session, QUEUE, {"order_id": order_id}, delay=payment_window,
        id=close_task_id(order_id), key=close_key(order_id),
    )  # fmt: skip
    return PlacedOrder(order_id, task_id, due_at)


async def pay_order(session: AsyncSession, outbox: AsyncOutbox, order_id: int) -> PayResult:
    """Mark a pending order paid and cancel its close task in the session's transaction."""
    paid = (
        await session.execute(
            update(orders)
            .where(orders.c.id == order_id, orders.c.status == "pending")
            .values(status="paid", paid_at=func.clock_timestamp())
            .returning(orders.c.id)
        )
    ).scalar_one_or_none()
    if paid is None:
        status = await session.scalar(select(orders.c.status).where(orders.c.id == order_id))
        return {"paid": PayResult.ALREADY_PAID, "closed": PayResult.CLOSED}.get(
            status or "", PayResult.NOT_FOUND
        )
    await outbox.cancel(session, QUEUE, close_task_id(order_id))
    return PayResult.PAID


# Counts every delivery, and closes only a pending order: a repeated delivery, or one that
# arrives after the payment, changes nothing but the count. `old` is the row before the update.
_CLOSE = text(
    "WITH old AS (SELECT id, status FROM orders WHERE id = :id FOR UPDATE) "
    "UPDATE orders SET close_deliveries = orders.close_deliveries + 1, "
    "status = CASE WHEN old.status = 'pending' THEN 'closed' ELSE old.status END, "
    "closed_at = CASE WHEN old.status = 'pending' THEN clock_timestamp() "
    "ELSE orders.closed_at END, "
    "close_due_at = CASE WHEN old.status = 'pending' THEN :due ELSE orders.close_due_at END "
    "FROM old WHERE orders.id = old.id RETURNING old.status"
)


async def close_if_unpaid(engine: AsyncEngine, order_id: int, task_due_at: datetime) -> bool:
    """The close task's effect, idempotent: True if this call closed the order.
    ``task_due_at`` (the task's due time, kept with the close) measures its lateness."""
    async with engine.begin() as conn:
        params = {"id": order_id, "due": task_due_at}
        before = (await conn.execute(_CLOSE, params)).scalar_one_or_none()
    return before == "pending"
