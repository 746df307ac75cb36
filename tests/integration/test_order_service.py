"""The reference service (examples/order_service) end to end, on a private PostgreSQL
database and a private Redis: the API with its relay and worker in the lifespan, the
reconciliation job, and the load script at small size."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sqlalchemy")
psycopg = pytest.importorskip("psycopg")

from examples.order_service.config import Settings  # noqa: E402
from examples.order_service.db import create_schema, make_engine  # noqa: E402
from examples.order_service.pgtemp import TempDatabase, server_dsn  # noqa: E402
from examples.order_service.reconcile import reconcile  # noqa: E402
from examples.order_service.service import QUEUE, close_task_id, place_order  # noqa: E402

from delayq import AsyncDelayQueue, DelayQueue, TaskState  # noqa: E402
from delayq.embedded import EmbeddedRedis  # noqa: E402
from delayq.outbox import AsyncOutbox, Relay  # noqa: E402
from tests.helpers import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _postgres_up() -> bool:
    try:
        psycopg.connect(server_dsn(), connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not _postgres_up(), reason=f"no PostgreSQL at {server_dsn()}"),
    # Starlette's TestClient asks for its httpx fork; httpx itself still works the same.
    pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated"),
]


@pytest.fixture
def dsn() -> Iterator[str]:
    with TempDatabase("delayq_order_service") as url:
        yield url


@pytest.fixture
def settings(dsn: str, redis7_server: EmbeddedRedis) -> Settings:
    return Settings(dsn=dsn, redis_url=redis7_server.url, prefix=f"os{uuid.uuid4().hex[:8]}")


@pytest.fixture
def queue(settings: Settings) -> Iterator[DelayQueue]:
    q = DelayQueue(QUEUE, settings.redis_url, prefix=settings.prefix)
    yield q
    q.close()


@pytest.fixture
def api(settings: Settings) -> Iterator[Any]:
    """The app with its relay and close worker running in the lifespan."""
    from examples.order_service.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(settings)) as client:
        yield client


def status_of(api: Any, order_id: int) -> str:
    reply = api.get(f"/orders/{order_id}")
    assert reply.status_code == 200
    return str(reply.json()["status"])


def test_order_gets_its_close_task_and_payment_cancels_it(api: Any, queue: DelayQueue) -> None:
    placed = api.post("/orders", json={"payment_window_s": 60}).json()
    assert placed["close_task_id"] == close_task_id(placed["id"])
    info = wait_until(lambda: queue.get(placed["close_task_id"]))
    assert info.state is TaskState.DELAYED
    assert info.key == f"close:{placed['id']}"
    assert api.post(f"/orders/{placed['id']}/pay").status_code == 200
    wait_until(lambda: queue.get(placed["close_task_id"]) is None)
    assert status_of(api, placed["id"]) == "paid"
    again = api.post(f"/orders/{placed['id']}/pay")
    assert again.status_code == 409
    assert "already_paid" in again.json()["detail"]


def test_unpaid_order_is_closed_at_its_due_time(api: Any) -> None:
    placed = api.post("/orders", json={"payment_window_s": 0.3}).json()
    wait_until(lambda: status_of(api, placed["id"]) == "closed")
    order = api.get(f"/orders/{placed['id']}").json()
    assert order["closed_at"] >= order["due_at"]
    late = api.post(f"/orders/{placed['id']}/pay")
    assert late.status_code == 409  # too late to pay: the close came first
    assert "closed" in late.json()["detail"]


def test_unknown_order_and_bad_input(api: Any) -> None:
    assert api.get("/orders/999999").status_code == 404
    assert api.post("/orders/999999/pay").status_code == 404
    assert api.post("/orders", json={"payment_window_s": -1}).status_code == 422


async def test_rolled_back_order_leaves_no_task(settings: Settings) -> None:
    engine = make_engine(settings.dsn)
    try:
        await create_schema(engine)
        outbox = AsyncOutbox(engine, prefix=settings.prefix)
        await outbox.install()
        from sqlalchemy.ext.asyncio import AsyncSession

        async with AsyncSession(engine) as session:
            with pytest.raises(RuntimeError):
                async with session.begin():
                    await place_order(session, outbox, timedelta(seconds=0))
                    raise RuntimeError("the request failed after the offer")
        status = await outbox.status()
        assert status.pending == 0
    finally:
        await engine.dispose()


async def test_reconciliation_finds_an_order_without_task(settings: Settings) -> None:
    """An order written without the outbox (the dual-write loss the outbox prevents) is
    found by the job, offered again, and closed; the next run finds nothing."""
    from examples.order_service.db import orders
    from examples.order_service.service import close_if_unpaid
    from sqlalchemy import insert, select, text

    engine = make_engine(settings.dsn)
    try:
        await create_schema(engine)
        outbox = AsyncOutbox(engine, prefix=settings.prefix)
        await outbox.install()
        async with engine.begin() as conn:
            lost = (
                await conn.execute(
                    insert(orders)
                    .values(due_at=text("now() - interval '1 minute'"))
                    .returning(orders.c.id)
                )
            ).scalar_one()
        async with AsyncDelayQueue(QUEUE, settings.redis_url, prefix=settings.prefix) as q:
            found = await reconcile(engine, outbox, q, grace=timedelta(seconds=1))
            assert found.reoffered == [lost]
            assert "1 without a task" in found.summary()
            await asyncio.to_thread(Relay(settings.dsn, settings.redis_url).relay_pending)
            task = await q.poll(5)
            assert task is not None and task.payload == {"order_id": lost}
            assert await close_if_unpaid(engine, lost, task.due_at)
            await task.ack()
            again = await reconcile(engine, outbox, q, grace=timedelta(seconds=1))
        assert again.overdue == 0
        assert "nothing to do" in again.summary()
        async with engine.connect() as conn:
            status = (
                await conn.execute(select(orders.c.status).where(orders.c.id == lost))
            ).scalar_one()
        assert status == "closed"
    finally:
        await engine.dispose()


def test_load_script_at_small_size(redis7_server: EmbeddedRedis) -> None:
    """The one command of the README, with 300 orders: every bar holds. Lateness is bounded
    generously here (the suite shares the machine); the README gives the measured figures."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "examples.order_service.load",
            "--orders", "300", "--rate", "150", "--window", "1-3", "--max-p99-ms", "1000",
        ],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis7_server.url},
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    figures = dict(re.findall(r"^(\S.*?\S)\s{2,}(\S.*)$", proc.stdout, re.MULTILINE))
    assert figures["unpaid orders left open"] == "0"
    assert figures["paid orders closed"] == "0"
    assert figures["orders closed before their due time"] == "0"
    assert figures["outbox rows left (pending / dead)"] == "0 / 0"
    assert figures["orders placed"].startswith("300 ")
    paid = int(figures["paid (close task cancelled)"].split()[0])
    closed = int(figures["closed by their task"].split()[0])
    assert paid + closed == 300
    assert "reconciliation: no order is pending past its due time; nothing to do" in out
    assert out.rstrip().endswith("OK")


def test_load_script_refuses_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "examples.order_service.load", "--window", "5-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--window needs 0 < MIN <= MAX" in proc.stderr
