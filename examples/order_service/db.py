"""The service's one table, and the engine (SQLAlchemy 2 async on psycopg 3)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    func,
    text,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

metadata = MetaData()

orders = Table(
    "orders",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    # pending -> paid, or pending -> closed; never both (the UPDATEs are guarded on 'pending').
    Column("status", String(16), nullable=False, server_default=text("'pending'")),
    Column("placed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When the close task is due: now() + the payment window, on the database's clock.
    Column("due_at", DateTime(timezone=True), nullable=False),
    Column("paid_at", DateTime(timezone=True)),
    Column("closed_at", DateTime(timezone=True)),
    # The due time of the close task that closed the order (Redis's clock): the close's
    # lateness is closed_at - close_due_at.
    Column("close_due_at", DateTime(timezone=True)),
    # Every delivery of the close task counts here, effective or not: a redelivery or a close
    # arriving after the payment shows up as a count with no change of status.
    Column("close_deliveries", Integer, nullable=False, server_default=text("0")),
)


def async_url(dsn: str) -> str:
    """A libpq URL (``postgresql://…``) as SQLAlchemy's URL for psycopg 3 async."""
    for scheme in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if dsn.startswith(scheme):
            return "postgresql+psycopg://" + dsn[len(scheme) :]
    raise ValueError(f"expected a postgresql:// URL, got {dsn!r}")


def make_engine(dsn: str, *, pool_size: int = 10) -> AsyncEngine:
    """The service's engine: a pool of psycopg 3 async connections."""
    return create_async_engine(async_url(dsn), pool_size=pool_size, max_overflow=pool_size)


async def create_schema(engine: AsyncEngine) -> None:
    """Create the orders table (idempotent)."""
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(
            text(
                "CREATE INDEX IF NOT EXISTS orders_pending_due ON orders (due_at) "
                "WHERE status = 'pending'"
            )
        )
