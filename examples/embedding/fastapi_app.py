"""FastAPI with a delayq worker in its lifespan: ``uvicorn examples.embedding.fastapi_app:app``.

``POST /orders`` places an order and schedules its close task; ``POST /orders/{id}/pay`` pays
it and cancels that task; an :class:`~delayq.AsyncWorker`, started in the lifespan with
``start_background()``, closes the orders still unpaid when their payment window ends.

The worker runs as a task of uvicorn's event loop and leaves SIGTERM/SIGINT to uvicorn
(``handle_signals`` is False by default): on SIGTERM uvicorn stops serving, then runs the
lifespan's shutdown, which stops the worker (running handlers get ``grace`` seconds, the tasks
it fetched ahead go back to the queue at once), and then exits by re-raising the signal.

Settings come from the environment: ``REDIS_URL``, ``DELAYQ_PREFIX``, ``PAYMENT_WINDOW_S``
(the default window), ``CLOSE_WORK_S`` (how long a close takes: it stands for the calls a
real close makes, e.g. voiding the card authorisation) and ``WORKER_GRACE_S``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

from delayq import AsyncDelayQueue, AsyncTask, AsyncWorker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("DELAYQ_PREFIX", "dq")
PAYMENT_WINDOW_S = float(os.environ.get("PAYMENT_WINDOW_S", "1800"))
CLOSE_WORK_S = float(os.environ.get("CLOSE_WORK_S", "0.05"))
# Below the time the platform gives the process to stop (Kubernetes: 30 s), so that a handler
# cut off by the grace period is handed back before the process is killed.
WORKER_GRACE_S = float(os.environ.get("WORKER_GRACE_S", "10"))

# The application owns logging (uvicorn configures only its own loggers): delayq's lines and
# ours go to stderr beside uvicorn's.
logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
log = logging.getLogger("orders")

# The example's database: a real service keeps orders in its own (examples/order_service).
orders: dict[int, dict[str, Any]] = {}
order_ids = itertools.count(1)


# --8<-- [start:worker]
async def close_unpaid_order(task: AsyncTask) -> None:
    """Close the order if it is still unpaid. Idempotent: a redelivery finds it closed."""
    await asyncio.sleep(CLOSE_WORK_S)
    order = orders.get(task.payload["order_id"])
    if order is not None and order["status"] == "pending":
        order["status"] = "closed"
        log.info("closed order %d (attempt %d)", order["id"], task.attempts)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncDelayQueue("close-unpaid-order", REDIS_URL, prefix=PREFIX) as queue:
        app.state.queue = queue
        # No handle_signals=True: uvicorn owns SIGTERM/SIGINT and ends this lifespan on them.
        worker = AsyncWorker(queue, close_unpaid_order, concurrency=4, grace=WORKER_GRACE_S)
        async with worker.start_background():
            yield
            log.info("lifespan shutdown: stopping the delayq worker")
    log.info("lifespan shutdown done: worker %s, queue closed", worker.health().state)


app = FastAPI(title="orders", lifespan=lifespan)
# --8<-- [end:worker]


@app.post("/orders", status_code=201)
async def place_order(request: Request, payment_window_s: float = PAYMENT_WINDOW_S) -> Any:
    order: dict[str, Any] = {"id": next(order_ids), "status": "pending"}
    orders[order["id"]] = order
    order["close_task_id"] = await request.app.state.queue.offer(
        {"order_id": order["id"]}, delay=payment_window_s
    )
    return order


@app.post("/orders/{order_id}/pay")
async def pay_order(request: Request, order_id: int) -> Any:
    order = orders.get(order_id)
    if order is None or order["status"] != "pending":
        raise HTTPException(409, "the order is not pending")
    order["status"] = "paid"
    await request.app.state.queue.cancel(order["close_task_id"])
    return order


@app.get("/orders/{order_id}")
async def get_order(order_id: int) -> Any:
    if order_id not in orders:
        raise HTTPException(404, "no such order")
    return orders[order_id]
