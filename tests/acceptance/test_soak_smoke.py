"""The soak's 60-s smoke (issue #21): the whole harness of ``make soak`` — producers with
caller ids, retries, dedup keys, cancels and reschedules; take/ack loops, ``consume()``, a
thread and an asyncio worker; the outbox and its relay — on a standalone Redis with
``appendfsync always``, under a nemesis that kills and stops consumers and the relay, jumps
a client's clock, kills -9, pauses, blocks and fills Redis. The checker must find nothing
unexplained in the history.

Bounds are generous for a loaded 2-core machine: lateness p99 outside fault windows under
1 s (it is a few ms when the machine is quiet), and fault windows extend 10 s past each
fault's end.
"""

from __future__ import annotations

import os

import psycopg
import pytest
from bench.soak.checker import summary
from bench.soak.history import load
from bench.soak.run import Config, Harness

pytestmark = pytest.mark.timeout(300)

PG = os.environ.get("DELAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
FAULTS = (
    "consumer-kill", "consumer-stop", "relay-kill", "client-clock", "redis-kill",
    "redis-pause", "redis-sleep", "maxmemory",
)  # fmt: skip


def test_a_minute_of_faults_leaves_a_history_the_checker_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    try:
        psycopg.connect(PG, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"the soak's outbox needs PostgreSQL at {PG} (DELAYQ_TEST_PG): {exc}")
    config = Config(
        duration_s=60, seed=21, fsync="always", faults=FAULTS, fault_every_s=6,
        fault_length_s=3, rate=20, outbox_dsn=PG, late_bound_ms=1000, grace_s=10,
        drain_s=90, out=str(tmp_path / "soak"),
    )  # fmt: skip
    report = Harness(config).run()
    figures = summary(report)
    assert report.valid, (figures, report.unexplained()[:10])
    # The history really exercised what it claims: load, every consumer kind, faults.
    assert figures["offers_ok"] >= 300 and figures["deliveries"] >= 300, figures
    assert figures["lost"] == 0  # every offer was durable (appendfsync always)
    assert len(report.windows) >= 4, report.windows
    events = load(tmp_path / "soak" / "history")
    kinds = {_kind(e.process) for e in events if e.f in ("fetch", "deliver") and e.value.get("id")}
    assert {"take", "consume", "worker", "async-worker"} <= kinds, kinds
    committed = [e for e in events if e.f == "outbox" and e.type == "ok" and e.value["commit"]]
    assert len(committed) >= 20, "the outbox hardly ran"


def _kind(process: str) -> str:
    """``async-worker-4#2`` -> ``async-worker``."""
    return process.split("#")[0].rsplit("-", 1)[0]
