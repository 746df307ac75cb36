"""Quiet, truthful logs (issue #22): a Redis outage seen by every part of a ``delayq worker``
process (its runner, its pub/sub connection, its fetch, ack and heartbeat loops) is one
WARNING naming the Redis and why, and one INFO saying how long it lasted; every long-running
command says when it stopped (SIGTERM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis, free_port
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A server this test stops and starts again on the same port."""
    server = EmbeddedRedis(aof=True).start()
    yield server
    server.stop()


class Program:
    """A ``delayq`` command as a child process, its stderr in a file (never a full pipe)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *args], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
        )  # fmt: skip

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode()

    def lines(self, level: str) -> list[str]:
        return [line for line in self.text().splitlines() if f" {level} " in line]

    def shows(self, fragment: str) -> bool:
        assert self.proc.poll() is None, self.text()
        return fragment in self.text()

    def terminate(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        return self.text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    started: list[Program] = []
    yield started
    for program in started:
        program.close()


def handler_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\n")
    return {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}"}


def test_an_outage_of_a_worker_process_is_one_warning_and_one_info(
    own_redis: EmbeddedRedis, prefix: str, tmp_path: Path, programs: list[Program]
) -> None:
    with DelayQueue("orders", own_redis.url, prefix=prefix) as q:
        first = q.offer({"n": 1})
    worker = Program(
        "worker", "handlers:handle", "-q", "orders", "--redis", own_redis.url,
        "--prefix", prefix, "--log-level", "DEBUG", env=handler_env(tmp_path),
    )  # fmt: skip
    programs.append(worker)
    wait_until(lambda: worker.shows("delayq worker started"), timeout=30)
    with DelayQueue("orders", own_redis.url, prefix=prefix) as q:
        wait_until(lambda: q.get(first) is None, timeout=30)  # handled: the worker works

    own_redis.kill()
    # Every part saw it and stayed quiet: the fetch loop's failures past the runner's
    # retry window are DEBUG lines ("failed again"), as are the pub/sub's and the runner's.
    wait_until(lambda: worker.shows("fetch from orders failed again"), timeout=30)
    own_redis.start()
    wait_until(lambda: worker.shows("available again after"), timeout=30)
    with DelayQueue("orders", own_redis.url, prefix=prefix) as q:
        done = q.offer({"n": 2})
        wait_until(lambda: q.get(done) is None, timeout=30)  # handled after the outage
    text = worker.terminate()

    warnings = [line for line in worker.lines("WARNING") if "Redis" in line]
    assert len(warnings) == 1, text
    assert f"Redis at {own_redis.url} unavailable (unreachable" in warnings[0], text
    infos = [line for line in worker.lines("INFO") if "Redis" in line]
    assert len(infos) == 1 and "available again after" in infos[0], text
    assert "delayq worker stopped" in text.splitlines()[-1], text


def test_exporter_and_dashboard_say_they_stopped_on_sigterm(
    redis7_server: EmbeddedRedis, programs: list[Program]
) -> None:
    target = ["--redis", redis7_server.url]
    exporter = Program("exporter", "--port", str(free_port()), *target)
    dashboard = Program("dashboard", "--port", str(free_port()), *target)
    programs += [exporter, dashboard]
    wait_until(lambda: exporter.shows("delayq exporter: serving"), timeout=30)
    wait_until(lambda: dashboard.shows("Uvicorn running on"), timeout=30)
    assert exporter.terminate().splitlines()[-1] == "delayq exporter: stopped"
    # uvicorn's own lines end the dashboard (it raises SIGTERM again once it has shut down).
    assert "Finished server process" in dashboard.terminate().splitlines()[-1]


def test_relay_says_it_stopped_on_sigterm(
    redis7_server: EmbeddedRedis, pg_dsn: str, table: str, outbox: object,
    programs: list[Program],
) -> None:  # fmt: skip
    relay = Program(
        "relay", "--dsn", pg_dsn, "--table", table, "--redis", redis7_server.url,
        "--name", "stop-line",
    )  # fmt: skip
    programs.append(relay)
    wait_until(lambda: relay.shows("listening on"), timeout=30)
    last = relay.terminate().splitlines()[-1]
    assert "outbox relay stop-line: stopped, 0 rows offered" in last, relay.text()
