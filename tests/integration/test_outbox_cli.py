"""``delayq outbox ...`` and ``delayq relay --once`` as a user runs them, and the outbox's
Prometheus metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox, RelayStats
from delayq.outbox._metrics import serve_relay_metrics
from tests.outbox_support import offer_committed

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


def delayq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_install_status_relay_dead_requeue(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    installed = delayq("outbox", "install", "--dsn", pg_dsn, "--table", table)
    assert installed.returncode == 0, installed.stderr
    assert f"outbox table {table} is installed" in installed.stdout
    assert delayq("outbox", "install", "--dsn", pg_dsn, "--table", table).returncode == 0

    outbox = Outbox(pg_dsn, table=table, prefix=prefix)
    ids = offer_committed(outbox, pg_dsn, 3)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"UPDATE \"{table}\" SET options = 'garbage' WHERE task_id = %s", (ids[0],))

    status = delayq("outbox", "status", "--dsn", pg_dsn, "--table", table, "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert (doc["pending"], doc["dead"]) == (3, 0)
    assert doc["queues"][0]["queue"] == "orders"

    relayed = delayq("relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", redis_url)
    assert relayed.returncode == 0, relayed.stderr
    assert relayed.stdout.strip() == "relayed 3 rows"
    assert orders.get(ids[1]) is not None and orders.get(ids[0]) is None

    plain = delayq("outbox", "status", "--dsn", pg_dsn, "--table", table)
    assert plain.stdout.splitlines()[0] == "outbox: 0 pending, 1 dead, oldest pending -"
    dead = delayq("outbox", "dead", "--dsn", pg_dsn, "--table", table)
    assert ids[0] in dead.stdout and "malformed options" in dead.stdout
    requeued = delayq("outbox", "requeue", "--dsn", pg_dsn, "--table", table)
    assert requeued.stdout.strip() == "1 dead rows are pending again"


def test_errors_are_one_line(pg_dsn: str) -> None:
    missing = delayq("outbox", "status", env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: give the database with --dsn or $DATABASE_URL"
    bad_table = delayq("outbox", "install", "--dsn", pg_dsn, "--table", "no-dashes")
    assert bad_table.returncode == 2 and "table 'no-dashes'" in bad_table.stderr
    nowhere = delayq("outbox", "status", "--dsn", "postgresql://postgres@127.0.0.1:1/none")
    assert nowhere.returncode == 1
    assert nowhere.stderr.startswith("error: PostgreSQL:") and "Traceback" not in nowhere.stderr
    for command in (("outbox", "status"), ("relay",)):
        no_table = delayq(*command, "--dsn", pg_dsn, "--table", "never_installed")
        assert no_table.returncode == 1
        assert no_table.stderr.strip() == (
            "error: no outbox table 'never_installed' in that database: run delayq outbox install"
        )


def test_metrics_endpoint(pg_dsn: str, table: str, prefix: str) -> None:
    outbox = Outbox(pg_dsn, table=table, prefix=prefix)
    outbox.install()
    offer_committed(outbox, pg_dsn, 4)
    stats = RelayStats(offered=7, dead=1, last_lag_s=0.002)
    server = serve_relay_metrics(outbox, stats, 0)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            body = reply.read().decode()
    finally:
        server.stop()
    assert f'delayq_outbox_pending{{prefix="{prefix}",queue="orders"}} 4.0' in body
    assert f'delayq_outbox_dead{{prefix="{prefix}",queue="orders"}} 0.0' in body
    assert "delayq_outbox_lag_seconds{" in body
    assert 'delayq_outbox_relayed_total{op="offer"} 7.0' in body
    assert "delayq_outbox_relay_dead_total 1.0" in body


def test_stats_shows_the_outbox(
    pg_dsn: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    outbox = Outbox(pg_dsn, prefix=prefix)  # the default table, which --outbox reads
    outbox.install()
    try:
        orders.offer("direct", 60)
        offer_committed(outbox, pg_dsn, 2)
        args = ("stats", "orders", "--redis", redis_url, "--prefix", prefix, "--outbox", pg_dsn)
        shown = delayq(*args)
        assert shown.returncode == 0, shown.stderr
        assert "outbox: 2 pending, 0 dead" in shown.stdout
        assert f"{prefix}:orders  pending 2" in shown.stdout
        lines = delayq(*args, "--json").stdout.splitlines()
        assert json.loads(lines[-1])["outbox"]["pending"] == 2
        assert json.loads(lines[0])[0]["queue"] == "orders"
    finally:
        with psycopg.connect(pg_dsn) as conn:
            conn.execute("DROP TABLE delayq_outbox")
