"""The embedding examples (examples/embedding, docs/embedding.md) served by real servers and
stopped by SIGTERM: uvicorn for the FastAPI app, gunicorn for the Flask one.

Each server completes its own graceful shutdown (the lifespan's shutdown, or the gunicorn
worker's exit), and the delayq worker inside hands back the tasks it held: they are ready in
the queue at once, not left to their visibility timeout, and none is lost. The Django pattern
(``manage.py delayq_worker`` under SIGTERM) is tested in tests/integration/test_django.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from delayq import DelayQueue, TaskState
from delayq.embedded import EmbeddedRedis, free_port

from ..helpers import wait_until

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("flask")
pytest.importorskip("gunicorn")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "close-unpaid-order"  # the examples' queue
# The examples' worker runs 4 handlers; a worker fetches more than that ahead by default.
CONCURRENCY = 4

UVICORN = [sys.executable, "-m", "uvicorn", "examples.embedding.fastapi_app:app"]
GUNICORN = [
    sys.executable, "-m", "gunicorn", "examples.embedding.flask_app:create_app()",
    "--workers", "1", "--no-control-socket",
]  # fmt: skip


@dataclass
class Served:
    """A server process running one of the examples, its output in a file."""

    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def place(self, window_s: float) -> dict[str, Any]:
        reply = httpx.post(f"{self.base}/orders", params={"payment_window_s": window_s})
        assert reply.status_code == 201, reply.text
        return dict(reply.json())

    def order(self, order_id: int) -> dict[str, Any]:
        return dict(httpx.get(f"{self.base}/orders/{order_id}").json())

    def serving(self) -> bool:
        try:
            return httpx.get(f"{self.base}/orders/0", timeout=2).status_code == 404
        except httpx.HTTPError:
            return False

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM, then the exit status once the process is gone."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@pytest.fixture
def serve(redis7_server: EmbeddedRedis, prefix: str, tmp_path: Path) -> Iterator[Any]:
    """Start ``command`` (bound to a free port) with the example's settings in the
    environment; waits until it serves. Whatever is left running is killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], port_flag: str, **settings: str) -> Served:
        port = free_port()
        log = tmp_path / f"server-{len(started)}.log"
        env = {
            **os.environ,
            "REDIS_URL": redis7_server.url,
            "DELAYQ_PREFIX": prefix,
            "PYTHONUNBUFFERED": "1",
            **settings,
        }
        bind = f"127.0.0.1:{port}" if port_flag == "--bind" else str(port)
        extra = (
            [port_flag, bind] if port_flag == "--bind" else ["--host", "127.0.0.1", "--port", bind]
        )
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*command, *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # gunicorn's worker too is ours to kill afterwards
            )  # fmt: skip
        started.append(proc)
        served = Served(proc, f"http://127.0.0.1:{port}", log)
        try:
            wait_until(lambda: served.serving() or proc.poll() is not None, timeout=15)
        except AssertionError:
            raise AssertionError(f"the server did not start:\n{served.output()}") from None
        assert proc.poll() is None, served.output()
        return served

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def queue(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[DelayQueue]:
    """The examples' queue, read from outside the server."""
    q = DelayQueue(QUEUE, redis7_server.url, prefix=prefix)
    yield q
    q.close()


def uvicorn(serve: Any, **settings: str) -> Served:
    return serve(UVICORN, "--port", **settings)  # type: ignore[no-any-return]


def gunicorn(serve: Any, **settings: str) -> Served:
    return serve(GUNICORN, "--bind", **settings)  # type: ignore[no-any-return]


def closes_unpaid_orders(server: Served, queue: DelayQueue) -> None:
    unpaid = [server.place(0.2) for _ in range(3)]
    paid = server.place(0.4)
    assert httpx.post(f"{server.base}/orders/{paid['id']}/pay").status_code == 200
    wait_until(lambda: all(server.order(o["id"])["status"] == "closed" for o in unpaid), 10)
    assert server.order(paid["id"])["status"] == "paid"
    # Acks follow the handlers in batches, a few milliseconds later.
    wait_until(lambda: queue.stats().counters.get("acked", 0) == 3, timeout=5)
    stats = queue.stats()
    assert (stats.delayed, stats.ready, stats.inflight) == (0, 0, 0)


def holds_tasks(server: Served, queue: DelayQueue, count: int) -> list[str]:
    """Orders due at once whose closes outlast the worker's grace; returns their task ids once
    the worker holds more of them than it runs (some are fetched ahead)."""
    ids = [server.place(0)["close_task_id"] for _ in range(count)]
    wait_until(lambda: queue.stats().inflight > CONCURRENCY, timeout=10)
    return ids


def handed_back(queue: DelayQueue, ids: list[str]) -> None:
    """Every task is back in the queue, ready now (the lease is 30 s), none lost."""
    stats = queue.stats()
    assert stats.inflight == 0
    assert stats.ready == len(ids)
    states = {task_id: queue.get(task_id) for task_id in ids}
    assert all(info is not None and info.state is TaskState.READY for info in states.values())


# -- FastAPI under uvicorn ----------------------------------------------------------------------


def test_fastapi_app_closes_unpaid_orders_then_stops_on_sigterm(
    serve: Any, queue: DelayQueue
) -> None:
    server = uvicorn(serve)
    closes_unpaid_orders(server, queue)
    status = server.terminate()
    out = server.output()
    # uvicorn re-raises the SIGTERM it caught once its shutdown is done (by design, since
    # 0.29): the process ends as killed by that signal.
    assert status == -signal.SIGTERM, out
    for line in (
        "Shutting down",
        "Waiting for application shutdown.",
        "lifespan shutdown: stopping the delayq worker",
        "delayq worker stopped: processed=3",
        "lifespan shutdown done: worker stopped, queue closed",
        "Application shutdown complete.",
    ):
        assert line in out, out
    assert out.count("closed order") == 3


def test_fastapi_app_hands_back_held_tasks_on_sigterm(serve: Any, queue: DelayQueue) -> None:
    server = uvicorn(serve, CLOSE_WORK_S="30", WORKER_GRACE_S="0.5")
    ids = holds_tasks(server, queue, 3 * CONCURRENCY)
    started = time.monotonic()
    status = server.terminate()
    out = server.output()
    assert status == -signal.SIGTERM, out
    assert time.monotonic() - started < 10  # the grace, not the 30 s close
    assert "Application shutdown complete." in out, out
    assert "closed order" not in out
    handed_back(queue, ids)


def test_fastapi_app_worker_that_takes_the_signals_breaks_uvicorn_shutdown(
    serve: Any, queue: DelayQueue, tmp_path: Path
) -> None:
    """Why handle_signals is False by default: a worker asked to take SIGTERM inside uvicorn
    (the old default) swallows the first one, so uvicorn keeps serving, and the next one kills
    the process outright, with no lifespan shutdown."""
    (tmp_path / "signal_taking_app.py").write_text(
        "import functools\n"
        "import examples.embedding.fastapi_app as example\n"
        "example.AsyncWorker = functools.partial(example.AsyncWorker, handle_signals=True)\n"
        "app = example.app\n"
    )
    server = serve(
        [sys.executable, "-m", "uvicorn", "signal_taking_app:app"], "--port",
        PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}",
    )  # fmt: skip
    # The worker installs its handlers once it has reached Redis, then says it started.
    wait_until(lambda: "delayq worker started" in server.output(), timeout=10)
    server.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "delayq worker stopped" in server.output(), timeout=10)
    assert server.serving()  # uvicorn never saw the signal
    assert "Shutting down" not in server.output()
    assert server.terminate() == -signal.SIGTERM
    assert "Waiting for application shutdown." not in server.output()


# -- Flask under gunicorn -----------------------------------------------------------------------


def test_flask_app_closes_unpaid_orders_then_stops_on_sigterm(
    serve: Any, queue: DelayQueue
) -> None:
    server = gunicorn(serve)
    closes_unpaid_orders(server, queue)
    status = server.terminate()
    out = server.output()
    assert status == 0, out  # gunicorn's SIGTERM is its graceful stop
    for line in (
        "Handling signal: term",
        "exiting: stopping the delayq worker",
        "delayq worker stopped: processed=3",
        "delayq worker stopped, queue closed",
        "Shutting down: Master",
    ):
        assert line in out, out
    assert out.count("closed order") == 3


def test_flask_app_hands_back_held_tasks_on_sigterm(serve: Any, queue: DelayQueue) -> None:
    server = gunicorn(serve, CLOSE_WORK_S="30", WORKER_GRACE_S="0.5")
    ids = holds_tasks(server, queue, 3 * CONCURRENCY)
    started = time.monotonic()
    status = server.terminate()
    out = server.output()
    assert status == 0, out
    assert time.monotonic() - started < 10
    assert "delayq worker stopped, queue closed" in out, out
    assert "closed order" not in out
    handed_back(queue, ids)
