"""The outbox from an operator's shell (issue #23): relays scoped by --prefix/--queue, dead
and missed rows purged, names from the table shown escaped, and the install traps refused
with a clear error."""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError
from delayq.outbox import Outbox
from tests.integration.test_outbox_cli import delayq
from tests.outbox_support import live_ids, offer_committed, pending, rows

pytest_plugins = ["tests.outbox_support"]


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


def test_a_relay_scoped_to_a_prefix_and_queue_leaves_the_other_rows(
    pg_dsn: str, table: str, prefix: str, orders: DelayQueue, redis_url: str
) -> None:
    mine = Outbox(pg_dsn, table=table, prefix=prefix)
    mine.install()
    theirs = Outbox(pg_dsn, table=table, prefix=f"{prefix}x")
    ids = offer_committed(mine, pg_dsn, 2)
    offer_committed(theirs, pg_dsn, 3)  # another team's rows, same table
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        other_queue = mine.offer(conn, "invoices", {"n": 1}, 60)
    relayed = delayq(
        "relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", redis_url,
        "--prefix", prefix, "--queue", "orders",
    )  # fmt: skip
    assert relayed.returncode == 0, relayed.stderr
    assert relayed.stdout.strip() == "relayed 2 rows"
    assert live_ids(orders, redis_url) == set(ids)
    assert pending(pg_dsn, table) == 4
    assert other_queue in {r[2] for r in rows(pg_dsn, table)}
    bad = delayq(
        "relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", redis_url,
        "--prefix", "x'; DROP TABLE t; --",
    )  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "invalid key prefix" in bad.stderr


def test_purge_dead_and_missed_rows(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str
) -> None:
    ids = offer_committed(outbox, pg_dsn, 3)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"UPDATE \"{table}\" SET options = 'garbage' WHERE task_id = %s", (ids[0],))
        with conn.transaction():
            outbox.reschedule(conn, "orders", "gone-already", 5)
    args = ("--dsn", pg_dsn, "--table", table)
    assert delayq("relay", "--once", *args, "--redis", redis_url).returncode == 0
    assert outbox.status().dead == 1 and outbox.status().missed == 1
    listed = delayq("outbox", "dead", *args, "--missed")
    assert "gone-already  reschedule" in listed.stdout and "found no waiting task" in listed.stdout
    dry = delayq("outbox", "purge-dead", *args)
    assert dry.returncode == 0 and "1 dead rows would go; add --yes" in dry.stdout
    assert outbox.status().dead == 1
    done = delayq("outbox", "purge-dead", *args, "--yes")
    assert done.returncode == 0 and "1 dead rows deleted" in done.stdout
    missed = delayq("outbox", "purge-dead", *args, "--missed", "--yes")
    assert "1 missed rows deleted" in missed.stdout
    status = outbox.status()
    assert (status.dead, status.missed, status.pending) == (0, 0, 0)


def test_status_shows_names_from_the_table_escaped(outbox: Outbox, pg_dsn: str, table: str) -> None:
    offer_committed(outbox, pg_dsn, 1)
    with psycopg.connect(pg_dsn) as conn:  # a forged row: a name with terminal escapes
        conn.execute(f"UPDATE \"{table}\" SET queue = E'q\\x1b[2J\\nforged line'")
    shown = delayq("outbox", "status", "--dsn", pg_dsn, "--table", table)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\\x1b" in shown.stdout
    assert not any(line.startswith("forged") for line in shown.stdout.splitlines())


@pytest.mark.parametrize(
    ("table", "schema", "says"),
    [
        ("t" * 51, "s" * 51, "NOTIFY channel"),
        ("delayq_outbox", "information_schema", "PostgreSQL's own"),
        ("delayq_outbox", "pg_catalog", "PostgreSQL's own"),
    ],
)
def test_install_traps_are_refused(pg_dsn: str, table: str, schema: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Outbox(pg_dsn, table=table, schema=schema)
    refused = delayq("outbox", "install", "--dsn", pg_dsn, "--table", table, "--schema", schema)
    assert refused.returncode != 0 and says in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_dsn_or_url_that_does_not_parse_shows_no_part_of_its_password(
    pg_dsn: str, table: str
) -> None:
    bad_dsn = delayq("relay", "--once", "--dsn", "postgresql://app:p%zzS3cret@127.0.0.1/db")
    assert bad_dsn.returncode != 0 and "Traceback" not in bad_dsn.stderr
    assert "zzS3cret" not in bad_dsn.stderr and "invalid PostgreSQL DSN" in bad_dsn.stderr
    bad_url = delayq(
        "relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", "redis://:S3cret/R@h/0"
    )
    assert bad_url.returncode != 0 and "S3cret" not in bad_url.stderr + bad_url.stdout


def test_the_dsn_and_the_redis_url_from_an_environment_variable_or_a_file(
    outbox: Outbox, orders: DelayQueue, pg_dsn: str, table: str, redis_url: str, tmp_path: Any
) -> None:
    ids = offer_committed(outbox, pg_dsn, 1)
    secret_file = tmp_path / "dsn"
    secret_file.write_text(pg_dsn + "\n")
    env = {**os.environ, "APP_REDIS": redis_url}
    relayed = delayq(
        "relay", "--once", "--dsn", f"file:{secret_file}", "--table", table,
        "--redis", "env:APP_REDIS", env=env,
    )  # fmt: skip
    assert relayed.returncode == 0, relayed.stderr
    assert live_ids(orders, redis_url) == set(ids)
    unset = delayq("outbox", "status", "--dsn", "env:NO_SUCH_VARIABLE_HERE")
    assert unset.returncode != 0 and "environment variable is not set" in unset.stderr
    missing = delayq("outbox", "status", "--dsn", f"file:{tmp_path / 'nope'}")
    assert missing.returncode != 0 and "No such file" in missing.stderr


def test_metrics_series_are_bounded_with_the_rest_summed(outbox: Outbox, pg_dsn: str) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from delayq.outbox import OutboxCollector

    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        for i in range(150):
            for _ in range(2 if i < 10 else 1):
                outbox.offer(conn, f"q{i}", {"n": i}, 60)
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(outbox, max_queues=100))
    body = prometheus_client.generate_latest(registry).decode()
    pending = [line for line in body.splitlines() if line.startswith("delayq_outbox_pending{")]
    assert len(pending) == 101
    assert 'delayq_outbox_pending{prefix="",queue="_other"} 50.0' in body
    assert all(f'queue="q{i}"}} 2.0' in body for i in range(10))  # the largest kept


def test_relay_command_refuses_a_sweep_interval_that_never_wakes(
    outbox: Outbox, pg_dsn: str, table: str
) -> None:
    refused = delayq("relay", "--dsn", pg_dsn, "--table", table, "--sweep-interval", "inf")
    assert refused.returncode != 0 and "sweep_interval must be" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_dead_rows_log_line_is_truncated() -> None:
    from delayq.outbox._relay import truncated

    line = truncated("x" * 5_000_000 + "\x1b[2J")
    assert len(line) < 600 and line.endswith("(5000004 characters)")
    assert "\x1b" not in truncated("a\x1b[2Jb")


def test_metrics_of_a_queue_whose_rows_were_all_relayed_read_zero(
    outbox: Outbox, pg_dsn: str, table: str, redis_url: str
) -> None:
    """A relayed-out queue's series reads 0 rather than vanishing (a gap in its graph, an
    alert on it that neither fires nor resolves); the bound still holds."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from delayq.outbox import OutboxCollector, Relay

    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(outbox, max_queues=2))

    def series() -> dict[str, float]:
        body = prometheus_client.generate_latest(registry).decode()
        return {
            line.split('queue="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("delayq_outbox_pending{")
        }

    def offer(queue: str, n: int) -> None:
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            for _ in range(n):
                outbox.offer(conn, queue, {"q": queue}, 60)

    offer("q0", 1)
    assert series() == {"q0": 1.0}
    assert Relay(pg_dsn, redis_url, table=table).relay_pending() == 1
    assert series() == {"q0": 0.0}
    offer("q1", 1)
    assert series() == {"q0": 0.0, "q1": 1.0}
    offer("q2", 2)  # two queues with rows fill the bound: the emptied one gives way
    assert series() == {"q1": 1.0, "q2": 2.0}
