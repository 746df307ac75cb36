"""The HTTP API: ``uvicorn examples.order_service.app:app`` (settings from the environment,
see config.py), or ``create_app(Settings(...))``.

- ``POST /orders`` ``{"payment_window_s": 1800}``: the order and its close task, in one
  transaction; 201 with the order's id, due time and close task id.
- ``POST /orders/{id}/pay``: pay it and cancel the close task, in one transaction;
  200, or 409 if it is already closed (or paid), 404 if there is no such order.
- ``GET /orders/{id}``: the order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from delayq.outbox import AsyncOutbox

from .background import Background
from .config import Settings
from .db import create_schema, make_engine, orders
from .service import PayResult, close_task_id, pay_order, place_order


class PlaceOrder(BaseModel):
    payment_window_s: float = Field(1800.0, gt=0, le=30 * 24 * 3600)


class OrderOut(BaseModel):
    id: int
    status: str
    due_at: datetime
    close_task_id: str
    paid_at: datetime | None = None
    closed_at: datetime | None = None


async def _session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


# At module level: FastAPI resolves the (postponed) annotations in the module's namespace.
Session = Annotated[AsyncSession, Depends(_session)]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service; the relay and the worker run in its lifespan if ``settings.background``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conf = settings or Settings.from_env()
        engine = make_engine(conf.dsn, pool_size=conf.pool_size)
        outbox = AsyncOutbox(engine, prefix=conf.prefix)
        await create_schema(engine)
        await outbox.install()
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.outbox = outbox
        background = Background(conf, engine) if conf.background else None
        if background is not None:
            await background.start()
        try:
            yield
        finally:
            if background is not None:
                await background.stop()
            await engine.dispose()

    app = FastAPI(title="order service", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def place(request: Request, s: Session, body: PlaceOrder | None = None) -> dict[str, Any]:
        window = timedelta(seconds=(body or PlaceOrder()).payment_window_s)
        async with s.begin():
            placed = await place_order(s, request.app.state.outbox, window)
        return {"id": placed.id, "due_at": placed.due_at, "close_task_id": placed.close_task_id}

    @app.post("/orders/{order_id}/pay")
    async def pay(request: Request, s: Session, order_id: int) -> dict[str, Any]:
        async with s.begin():
            result = await pay_order(s, request.app.state.outbox, order_id)
        if result is PayResult.NOT_FOUND:
            raise HTTPException(404, f"no order {order_id}")
        if result is not PayResult.PAID:
            raise HTTPException(409, f"order {order_id} is {result.value}")
        return {"id": order_id, "status": "paid"}

    @app.get("/orders/{order_id}")
    async def get(s: Session, order_id: int) -> OrderOut:
        row = (await s.execute(select(orders).where(orders.c.id == order_id))).mappings().first()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return OrderOut(close_task_id=close_task_id(order_id), **row)

    return app


def __getattr__(name: str) -> Any:
    # `uvicorn examples.order_service.app:app` builds the app on first access, so importing
    # this module (tests, the load script) does not need the environment.
    if name == "app":
        return create_app()
    raise AttributeError(name)
