"""Flask with a delayq worker thread: ``gunicorn 'examples.embedding.flask_app:create_app()'``.

``POST /orders`` places an order and schedules its close task; ``POST /orders/{id}/pay`` pays
it and cancels that task; a thread :class:`~delayq.Worker`, started with
``start_background()`` when the app is created, closes the orders still unpaid when their
payment window ends.

Why gunicorn: it is what runs Flask in production, and it stops a worker process gracefully
on SIGTERM (the arbiter passes the signal on, the worker finishes its request and exits
normally), so ``atexit`` runs: there the delayq worker is stopped, running handlers get
``grace`` seconds and the tasks it fetched ahead go back to the queue at once. The delayq
worker leaves the signals to gunicorn (``handle_signals`` is False by default). Each gunicorn
worker process runs a delayq worker of its own, which is safe: a task goes to one of them.
Do not use ``--preload``: the thread would start in the arbiter, and a fork keeps no threads.
``flask run`` (the development server) works too, stopped with Ctrl-C; a SIGTERM kills it
without ``atexit``, which is one more reason not to serve with it.

Settings come from the environment: ``REDIS_URL``, ``DELAYQ_PREFIX``, ``PAYMENT_WINDOW_S``
(the default window), ``CLOSE_WORK_S`` (how long a close takes: it stands for the calls a
real close makes, e.g. voiding the card authorisation) and ``WORKER_GRACE_S``.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
from typing import Any

from flask import Flask, abort, request

from delayq import BackgroundWorker, DelayQueue, Task, Worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("DELAYQ_PREFIX", "dq")
PAYMENT_WINDOW_S = float(os.environ.get("PAYMENT_WINDOW_S", "1800"))
CLOSE_WORK_S = float(os.environ.get("CLOSE_WORK_S", "0.05"))
# Below gunicorn's --graceful-timeout (30 s), after which it kills the worker process.
WORKER_GRACE_S = float(os.environ.get("WORKER_GRACE_S", "10"))

log = logging.getLogger("orders")

# The example's database: a real service keeps orders in its own.
orders: dict[int, dict[str, Any]] = {}
orders_lock = threading.Lock()  # requests and handlers run in different threads
order_ids = itertools.count(1)


# --8<-- [start:worker]
def close_unpaid_order(task: Task) -> None:
    """Close the order if it is still unpaid. Idempotent: a redelivery finds it closed."""
    time.sleep(CLOSE_WORK_S)
    with orders_lock:
        order = orders.get(task.payload["order_id"])
        if order is None or order["status"] != "pending":
            return
        order["status"] = "closed"
    log.info("closed order %d (attempt %d)", order["id"], task.attempts)


def stop_worker(background: BackgroundWorker, queue: DelayQueue) -> None:
    log.info("exiting: stopping the delayq worker")
    try:
        background.stop()
    finally:
        queue.close()
    log.info("delayq worker %s, queue closed", background.worker.health().state)


def create_app() -> Flask:
    """The app, with its delayq worker running in a thread until the process exits."""
    # gunicorn configures only its own loggers: delayq's lines and ours go to stderr too.
    logging.basicConfig(level=logging.INFO, format="[%(process)d] %(name)s: %(message)s")
    queue = DelayQueue("close-unpaid-order", REDIS_URL, prefix=PREFIX)
    # No handle_signals=True: gunicorn owns SIGTERM/SIGINT; its worker exits, and atexit runs.
    worker = Worker(queue, close_unpaid_order, concurrency=4, grace=WORKER_GRACE_S)
    atexit.register(stop_worker, worker.start_background(), queue)

    app = Flask(__name__)
    # --8<-- [end:worker]

    @app.post("/orders")
    def place_order() -> Any:
        window = float(request.args.get("payment_window_s", PAYMENT_WINDOW_S))
        with orders_lock:
            order: dict[str, Any] = {"id": next(order_ids), "status": "pending"}
            orders[order["id"]] = order
        order["close_task_id"] = str(queue.offer({"order_id": order["id"]}, delay=window))
        return order, 201

    @app.post("/orders/<int:order_id>/pay")
    def pay_order(order_id: int) -> Any:
        with orders_lock:
            order = orders.get(order_id)
            if order is None or order["status"] != "pending":
                abort(409)
            order["status"] = "paid"
        queue.cancel(order["close_task_id"])
        return order

    @app.get("/orders/<int:order_id>")
    def get_order(order_id: int) -> Any:
        with orders_lock:
            if order_id not in orders:
                abort(404)
            return dict(orders[order_id])

    return app
