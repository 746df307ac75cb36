"""The soak on every topology, briefly (issue #21; ``-m topology``, beside the rest in
``make test``): a standalone Redis in a network namespace under partitions and server clock
steps, the Sentinel group of bench/soak/splitbrain.py under split brains, and a replicated
cluster with a sharded queue under failovers and slot migration. Each run's history must
pass the checker; what a split brain loses without ``Durability`` is counted, not excused
blindly (the checker explains a loss only by a server fault after the write).

Root is needed (network namespaces, ``tc netem``), and libfaketime for the server clock
(``.ci/run`` installs iproute2 and faketime).
"""

from __future__ import annotations

import os
import shutil

import pytest
from bench.soak.checker import summary
from bench.soak.run import Config, Harness
from bench.soak.servers import FAKETIME_LIB

pytestmark = [pytest.mark.topology, pytest.mark.timeout(300)]


def _needs_root_network() -> None:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.fail("the soak's partitions need root, ip and tc (iproute2): see .ci/run")


def _run(tmp_path, **settings: object):  # type: ignore[no-untyped-def]
    config = {
        "duration_s": 35.0, "rate": 15.0, "outbox_dsn": None, "late_bound_ms": 1000.0,
        "grace_s": 10.0, "drain_s": 90.0, "fault_every_s": 7.0, "fault_length_s": 3.0,
        "out": str(tmp_path / "soak"),
    }  # fmt: skip
    config.update(settings)
    report = Harness(Config(**config)).run()  # type: ignore[arg-type]
    figures = summary(report)
    assert report.valid, (figures, report.unexplained()[:10])
    assert figures["offers_ok"] >= 200 and figures["deliveries"] >= 200, figures
    return report, figures


def test_partitions_and_server_clock_steps_on_a_standalone_redis(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _needs_root_network()
    if not os.path.exists(FAKETIME_LIB):
        pytest.fail(f"the server clock fault needs libfaketime ({FAKETIME_LIB}): see .ci/run")
    report, figures = _run(
        tmp_path, seed=31, fsync="always", network=True,
        faults=("partition", "server-clock", "redis-kill", "consumer-kill"),
    )  # fmt: skip
    kinds = {w.fault for w in report.windows}
    assert {"partition", "server-clock"} <= kinds, kinds
    assert figures["lost"] == 0 and figures["early"] == 0 and figures["double_leases"] == 0


def test_split_brains_on_sentinel_lose_only_offers_made_without_durability(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _needs_root_network()
    report, figures = _run(
        tmp_path, seed=32, topology="sentinel", network=True, fault_every_s=12.0,
        fault_length_s=3.0, faults=("split-brain", "consumer-kill"),
    )  # fmt: skip
    assert any(w.fault == "split-brain" for w in report.windows), report.windows
    assert figures["early"] == 0 and figures["lost_unexplained"] == 0, figures


def test_failovers_and_slot_migration_on_a_cluster_with_a_sharded_queue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report, figures = _run(
        tmp_path, seed=33, topology="cluster", fault_every_s=9.0,
        faults=("failover", "migrate", "consumer-kill"),
    )  # fmt: skip
    assert {"failover", "migrate"} & {w.fault for w in report.windows}, report.windows
    assert figures["early"] == 0 and figures["lost_unexplained"] == 0, figures
