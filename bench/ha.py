"""Failover benchmark (issue #10): ``python -m bench.ha``.

For each topology (a Sentinel group: master, 2 replicas, 3 sentinels, down-after 1000 ms; a
replicated cluster: 3 masters with a replica each, node timeout 2000 ms) and each fault, it
runs a producer process (offers with caller ids, retried after an error) and two worker
processes, injects the fault, and prints:

* ``detect_ms``: fault -> the topology reports a new master (sentinels agree / every node);
* ``resume_ms``: fault -> the first handler start of a task whose offer returned after the
  fault, minus its delay (a split brain serves these from the old master: see lost);
* ``offer_gap_ms``: the longest wait between two offers returning (the producer's outage);
* ``lost``, ``duplicated``, ``overlapping`` (two handler runs of one task at once).

Everything runs on 127.0.0.1 with the test toolkit (tests/topology.py) and the scenario
processes (tests/integration/procs/); run it from the repository root. Bounded: about 25 s
per run, longer when the producer never recovers (it gives up after its budget). The
``redis+sentinel://`` runs show today's connection layer as it is.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from redis.cluster import key_slot
from tests.integration.procs.ha_load import HaLoad, Tally, now_ms
from tests.topology import ReplicatedCluster, SentinelGroup, TopologyTimeout, running

from delayq.embedded import EmbeddedRedis

RESULTS = Path(__file__).parent / "results"
FAULTS = {"sentinel": ["kill", "failover", "stop"], "cluster": ["kill", "failover"]}
QUEUE = "orders"


def target(topology: Any, form: str) -> str:
    if form == "url":
        return str(topology.url)
    if isinstance(topology, SentinelGroup):
        hosts = ",".join(f"{h}:{p}" for h, p in topology.sentinel_addresses)
        return f"sentinel:{hosts}/{topology.SERVICE}"
    return "cluster:" + ",".join(f"127.0.0.1:{n.port}" for n in topology.nodes)


def inject(topology: Any, fault: str) -> None:
    """Apply ``fault`` to the master of the benchmark's queue and wait for its successor."""
    if isinstance(topology, SentinelGroup):
        old = topology.master()
        if fault == "failover":
            topology.failover()
            return
        old.kill() if fault == "kill" else old.pause()
        try:
            topology.wait_for_new_master(old)
        finally:
            if fault == "stop":
                old.resume()
        return
    slot = key_slot(QUEUE.encode())
    old = topology.master_of(slot)
    if fault == "failover":
        topology.failover(topology.replicas_of(old)[0])
        return
    old.kill()
    topology.wait_for_new_master(old, slot=slot)


def measure(tally: Tally, fault_ms: int, delay_ms: int) -> int | None:
    starts = [
        min(r["start_ms"] for r in tally.handled[i])
        for i, t in tally.offered.items()
        if t > fault_ms and i in tally.handled
    ]
    return min(starts) - fault_ms - delay_ms if starts else None


def run_one(
    kind: str, fault: str, form: str, durable: int, args: argparse.Namespace
) -> dict[str, Any]:
    topology = SentinelGroup() if kind == "sentinel" else ReplicatedCluster()
    delay_ms = int(args.delay * 1000)
    with EmbeddedRedis() as ledger, running(topology):
        prefix = f"ha{int(time.time() * 1000) % 10**8}"
        with HaLoad(target(topology, form), ledger.url, prefix, [QUEUE]) as load:
            load.start_workers(2)
            budget_s = args.tasks / args.rate + 30
            load.start_producer(
                args.tasks,
                rate=args.rate,
                delay_s=args.delay,
                max_seconds=budget_s,
                durable=durable,
            )
            load.wait_offered(args.tasks // 10)
            fault_ms = now_ms()
            try:
                inject(topology, fault)
                detect_ms: int | None = now_ms() - fault_ms
            except TopologyTimeout as exc:
                print(f"  no new master: {exc}")
                detect_ms = None
            try:
                load.wait_producers(budget_s + 5)
            except AssertionError as exc:  # reported, not raised: the figures say the rest
                print(f"  producer did not finish: {str(exc)[:200]}")
            tally = load.wait_all_handled(20)
    return {
        "topology": kind,
        "fault": fault,
        "form": form,
        "durable": bool(durable),
        "detect_ms": detect_ms,
        "resume_ms": measure(tally, fault_ms, delay_ms),
        "offer_gap_ms": tally.longest_offer_gap_ms(),
        "offered": len(tally.offered),
        "lost": len(tally.lost),
        "duplicated": len(tally.duplicated),
        "overlapping": len(tally.overlapping),
        "producer_errors": dict(tally.error_kinds()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", choices=["sentinel", "cluster", "both"], default="both")
    parser.add_argument("--fault", choices=["kill", "failover", "stop", "all"], default="all")
    parser.add_argument("--form", choices=["client", "url", "both"], default="both")
    parser.add_argument("--tasks", type=int, default=2000, help="offers per run")
    parser.add_argument("--rate", type=float, default=100.0, help="offers per second")
    parser.add_argument("--delay", type=float, default=0.05, help="each task's delay, s")
    parser.add_argument(
        "--durable",
        choices=["no", "yes", "both"],
        default="both",
        help="offers with Durability(replicas=1), without, or each fault both ways",
    )
    parser.add_argument("--json", action="store_true", help="write bench/results/ha.json")
    args = parser.parse_args()

    kinds = ["sentinel", "cluster"] if args.topology == "both" else [args.topology]
    forms = ["client", "url"] if args.form == "both" else [args.form]
    rows = []
    for kind in kinds:
        for fault in FAULTS[kind] if args.fault == "all" else [args.fault]:
            if fault not in FAULTS[kind]:
                continue
            for form in forms:
                for durable in {"no": [0], "yes": [1], "both": [0, 1]}[args.durable]:
                    label = ", durable offers" if durable else ""
                    print(f"{kind} {fault} ({form}{label}) ...", flush=True)
                    row = run_one(kind, fault, form, durable, args)
                    print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                    rows.append(row)
    if args.json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "ha.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
