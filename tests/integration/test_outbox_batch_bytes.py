"""Relay batches bounded in bytes (issue #23): the claim counts envelopes and options in
``seq`` order and sends those past ``batch_bytes`` without them, so a batch never brings more
than the bound into the relay (one larger row goes alone); the rows left wait for the next
batch, none lost or applied twice. Measured on what the relay received (its stats, and the
``delayq relay`` command's DEBUG lines)."""

from __future__ import annotations

import re

import psycopg
import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from delayq.exceptions import ConfigError
from delayq.outbox import Outbox, Relay
from delayq.outbox._schema import Schema
from tests.integration.test_outbox_cli import delayq
from tests.outbox_support import live_ids, offered_count, pending

pytest_plugins = ["tests.outbox_support"]

_CUT = re.compile(r"batch cut at (\d+) of (\d+) rows by batch_bytes \((\d+) bytes\)")


@pytest.fixture
def redis_server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


def offer_sized(outbox: Outbox, dsn: str, sizes: list[int]) -> list[str]:
    """One committed transaction of offers whose payloads are ``sizes`` characters long."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        return [outbox.offer(conn, "orders", "x" * size, 3600) for size in sizes]


def envelope_bytes(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f'SELECT sum(octet_length(envelope) + octet_length(options)) FROM "{table}"'
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_rows_over_the_bound_go_over_several_batches_none_lost_or_twice(
    outbox: Outbox, pg_dsn: str, table: str, orders: DelayQueue, redis_url: str
) -> None:
    ids = offer_sized(outbox, pg_dsn, [20_000] * 40)
    total = envelope_bytes(pg_dsn, table)
    bound = 64 << 10
    assert total > 10 * bound  # 40 rows, three a batch
    relay = Relay(pg_dsn, redis_url, table=table, batch_bytes=bound)
    assert relay.relay_pending() == 40
    assert pending(pg_dsn, table) == 0
    assert live_ids(orders, redis_url) == set(ids)
    assert offered_count(orders) == 40  # each created once
    assert relay.stats.duplicates == 0 and relay.stats.dead == 0
    assert relay.stats.batches == 14  # 3 rows of ~20 kB a batch (the last one alone)
    # What came in per batch, the rows past the bound included (without their envelopes):
    # within the bound, though each claim counted every pending row.
    assert 3 * 20_000 < relay.stats.largest_batch_bytes <= bound


def test_a_row_larger_than_the_bound_goes_alone(
    outbox: Outbox, pg_dsn: str, table: str, orders: DelayQueue, redis_url: str
) -> None:
    big, *small = offer_sized(outbox, pg_dsn, [300_000, 10_000, 10_000, 10_000])
    relay = Relay(pg_dsn, redis_url, table=table, batch_bytes=100_000)
    assert relay.relay_pending() == 4
    assert live_ids(orders, redis_url) == {big, *small}
    assert offered_count(orders) == 4
    assert relay.stats.batches == 2  # the large row, then the three others
    assert 300_000 < relay.stats.largest_batch_bytes < 301_000  # the others came empty


def test_the_default_bound_leaves_small_rows_in_one_batch(
    outbox: Outbox, pg_dsn: str, table: str, redis_url: str
) -> None:
    offer_sized(outbox, pg_dsn, [1_000] * 200)
    relay = Relay(pg_dsn, redis_url, table=table)  # 4 MiB
    assert relay.relay_pending() == 200
    assert relay.stats.batches == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4MiB", (1 << 30) + 1])
def test_a_bound_that_cannot_work_is_refused(pg_dsn: str, bad: object) -> None:
    with pytest.raises(ConfigError, match="batch_bytes must be an int from 1 to"):
        Relay(pg_dsn, "redis://127.0.0.1:1/0", batch_bytes=bad)  # type: ignore[arg-type]


def test_relay_command_bounds_its_batches(
    outbox: Outbox, pg_dsn: str, table: str, orders: DelayQueue, redis_url: str
) -> None:
    ids = offer_sized(outbox, pg_dsn, [20_000] * 12)
    done = delayq(
        "relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", redis_url,
        "--batch-bytes", "64KiB", "--log-level", "DEBUG",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "relayed 12 rows"
    cuts = [tuple(map(int, m)) for m in _CUT.findall(done.stderr)]
    # 12 rows, 3 a batch: the first three batches are cut (the last takes what is left).
    assert [(taken, fetched) for taken, fetched, _ in cuts] == [(3, 12), (3, 9), (3, 6)]
    assert all(3 * 20_000 < size <= 64 << 10 for _, _, size in cuts)
    assert live_ids(orders, redis_url) == set(ids)
    assert offered_count(orders) == 12


def test_relay_once_is_quiet_unless_asked(
    outbox: Outbox, pg_dsn: str, table: str, redis_url: str
) -> None:
    offer_sized(outbox, pg_dsn, [20_000] * 4)
    done = delayq(
        "relay", "--once", "--dsn", pg_dsn, "--table", table, "--redis", redis_url,
        "--batch-bytes", "32KiB",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("relayed 4 rows\n", "")  # WARNING and up only


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4MB", "error: not a size for --batch-bytes: '4MB' (bytes, or a number with KiB"),
        ("lots", "error: not a size for --batch-bytes: 'lots'"),
        ("0", "error: --batch-bytes must be from 1 byte to 1GiB, got '0'"),
        ("2GiB", "error: --batch-bytes must be from 1 byte to 1GiB, got '2GiB'"),
    ],
)
def test_relay_command_refuses_a_bad_bound(
    outbox: Outbox, pg_dsn: str, table: str, value: str, message: str
) -> None:
    done = delayq("relay", "--once", "--dsn", pg_dsn, "--table", table, "--batch-bytes", value)
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr
    assert "Traceback" not in done.stderr


def test_a_claim_locks_its_batch_not_the_backlog(outbox: Outbox, pg_dsn: str, table: str) -> None:
    # A window over the locked rows that the planner sorts would lock every pending row
    # before the first one came back (an ORDER BY in the window did).
    offer_sized(outbox, pg_dsn, [100] * 300)
    claim = Schema(table).claim_batch(20, batch_bytes=1_000)
    with psycopg.connect(pg_dsn, autocommit=True) as relay, psycopg.connect(pg_dsn) as other:
        cur = relay.execute(claim)
        while cur.description is None and cur.nextset():
            pass
        fetched = cur.fetchall()
        in_batch = [row[-1] for row in fetched]
        taken = in_batch.count(True)  # ~100-byte rows, a 1,000-byte bound
        assert len(fetched) == 20 and 5 < taken < 10
        assert in_batch == [True] * taken + [False] * (20 - taken)
        free = other.execute(
            f'SELECT count(*) FROM (SELECT seq FROM "{table}" FOR UPDATE SKIP LOCKED) s'
        ).fetchone()
        assert free is not None and free[0] >= 300 - 21  # the window reads one row ahead
        relay.execute("ROLLBACK")
