"""Fixtures and helpers of the outbox tests (``pytest_plugins = ["tests.outbox_support"]``).

Each test session creates its own database ``delayq_test_<random>`` on the local PostgreSQL
server (``$DELAYQ_TEST_PG``, default ``postgresql://postgres@127.0.0.1:5432/postgres``) and
drops it at the end; it never touches another database. Each test gets its own outbox table
in it, so tests do not see each other's rows.

The test modules import the helpers below before pytest registers this module as a plugin,
so pytest cannot rewrite its asserts (they are plain checks anyway): PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import redis

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox
from tests.helpers import wait_until

ADMIN_DSN = os.environ.get("DELAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _dsn_for(database: str) -> str:
    base, _, _ = ADMIN_DSN.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A private database for this test session (each xdist worker has its own)."""
    name = f"delayq_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"the outbox tests need PostgreSQL at {ADMIN_DSN} (set DELAYQ_TEST_PG): {exc}",
            pytrace=False,
        )
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _dsn_for(name)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def table() -> str:
    return f"ob_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def outbox(pg_dsn: str, table: str, prefix: str) -> Outbox:
    """An installed outbox with its own table, offering under the test's key prefix."""
    box = Outbox(pg_dsn, table=table, prefix=prefix)
    box.install()
    return box


@pytest.fixture
def orders(make_queue: Any) -> DelayQueue:
    return make_queue("orders")  # type: ignore[no-any-return]


def pending(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM \"{table}\" WHERE status = 'pending'").fetchone()
        assert row is not None
        return int(row[0])


def rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f'SELECT seq, op, task_id, status, error FROM "{table}" ORDER BY seq'
        ).fetchall()


def live_ids(queue: DelayQueue, url: str) -> set[str]:
    """Ids of every task the queue holds, in any state (its tasks hash)."""
    with redis.Redis.from_url(url) as client:
        return {k.decode() for k in client.hkeys(queue.keys.key("tasks"))}


def offered_count(queue: DelayQueue) -> int:
    """Tasks the queue's scripts created (a resend that matched a live task is not counted)."""
    return int(queue.stats().counters.get("offered", 0))


def offer_committed(
    outbox: Outbox, dsn: str, count: int, delay: float = 3600, **kw: Any
) -> list[str]:
    """Offer ``count`` tasks in one committed transaction; their ids."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        return [outbox.offer(conn, "orders", {"n": i}, delay, **kw) for i in range(count)]


def backend_pids(dsn: str, application_name: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database()",
            (application_name,),
        ).fetchall()
        return [int(r[0]) for r in found]


def terminate_backends(dsn: str, application_name: str) -> int:
    """Cut a relay's PostgreSQL sessions as a network fault or a server restart would."""
    pids = backend_pids(dsn, application_name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(pids)


@contextmanager
def relay_process(
    dsn: str, redis_url: str, table: str, *extra: str, name: str = "delayq-relay-proc"
) -> Iterator[subprocess.Popen[bytes]]:
    """``delayq relay`` as a child process (killed at the end if still running)."""
    args = [sys.executable, "-m", "delayq.cli", "relay", "--dsn", dsn, "--name", name]
    args += ["--redis", redis_url, "--table", table, *extra]
    # stderr to a file, not a pipe: a relay logging through a long fault must never block
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_until(lambda: len(backend_pids(dsn, name)) >= 2 or proc.poll() is not None, 20)
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"relay exited: {log.read().decode()[-2000:]}")
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(10)


def stop_redis(server: EmbeddedRedis) -> None:
    """Freeze the server (SIGSTOP): connections stay open and calls hang."""
    assert server._proc is not None
    os.kill(server._proc.pid, signal.SIGSTOP)


def resume_redis(server: EmbeddedRedis) -> None:
    assert server._proc is not None
    os.kill(server._proc.pid, signal.SIGCONT)


def db_now(dsn: str) -> float:
    """The database's clock, epoch seconds."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
        assert row is not None
        return float(row[0])


def wait_drained(dsn: str, table: str, timeout: float = 30.0) -> None:
    wait_until(lambda: pending(dsn, table) == 0, timeout)


def monotonic_ms() -> float:
    return time.monotonic() * 1000


class TcpProxy:
    """A TCP forwarder to PostgreSQL on a port of its own, which a test can take down (every
    connection cut, new ones refused) and bring back: a database outage that leaves the
    shared server alone."""

    def __init__(self, target_port: int = 5432) -> None:
        self.target = ("127.0.0.1", target_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def dsn(self, dsn: str) -> str:
        """``dsn`` (a URL on 127.0.0.1:5432) through this proxy."""
        return dsn.replace("127.0.0.1:5432", f"127.0.0.1:{self.port}", 1)

    def up(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
