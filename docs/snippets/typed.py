"""Typed payloads: a dataclass (nested ones, datetimes, UUIDs, Decimals too) comes back as
itself, and type checkers see task.payload as that class."""

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID, uuid4

from delayq import DelayQueue

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class Customer:
    id: UUID
    email: str


@dataclass
class CloseOrder:
    order_id: int
    customer: Customer
    total: Decimal
    placed_at: datetime
    reason: str = "unpaid"


queue = DelayQueue("typed-orders", redis=REDIS_URL, payload_type=CloseOrder)
order = CloseOrder(42, Customer(uuid4(), "ada@example.com"), Decimal("19.90"), datetime.now(UTC))
queue.offer(order, delay=0.1)

task = queue.take()  # mypy: Task[CloseOrder], so task.payload is a CloseOrder
assert task.payload == order and isinstance(task.payload.customer, Customer)
print(task.payload.total, task.payload.placed_at.isoformat())
task.ack()
queue.close()
