"""``python -m bench.soak``: one soak run; prints its figures and the checker's verdict."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from . import checker, nemesis
from .run import CONSUMERS, Config, Harness


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load and faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fsync", choices=("everysec", "always"), default="everysec")
    names = ", ".join(nemesis.FAULTS)
    p.add_argument("--faults", default="all", help=f"comma-separated, 'all' or 'none': {names}")
    p.add_argument("--fault-every", type=float, default=8.0, help="mean seconds between faults")
    p.add_argument("--fault-length", type=float, default=4.0, help="mean fault length, s")
    p.add_argument("--rate", type=float, default=25.0, help="producer operations/s")
    p.add_argument("--consumers", default=",".join(CONSUMERS))
    p.add_argument("--outbox", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="admin DSN for a private outbox database; '' for none")  # fmt: skip
    p.add_argument("--network", action="store_true",
                   help="Redis in a network namespace (needed by 'partition'; root)")  # fmt: skip
    p.add_argument(
        "--topology", choices=("standalone", "sentinel", "cluster"), default="standalone"
    )
    p.add_argument("--min-replicas", type=int, default=0,
                   help="min-replicas-to-write of the split-brain Sentinel group")  # fmt: skip
    p.add_argument("--durable-leases", type=int, default=0, metavar="N",
                   help="consumers: Durability(replicas=N, after_fetch=True)")  # fmt: skip
    p.add_argument("--late-bound-ms", type=float, default=250.0)
    p.add_argument("--out", default="", help="directory for the history and result.json")
    a = p.parse_args(argv)
    faults = (
        nemesis.FAULTS if a.faults == "all" else () if a.faults == "none"
        else tuple(f.strip() for f in a.faults.split(",") if f.strip())
    )  # fmt: skip
    unknown = set(faults) - set(nemesis.FAULTS)
    if unknown:
        p.error(f"unknown faults: {', '.join(sorted(unknown))}")
    config = Config(
        duration_s=a.duration, seed=a.seed, fsync=a.fsync, faults=faults,
        fault_every_s=a.fault_every, fault_length_s=a.fault_length, rate=a.rate,
        consumers=tuple(a.consumers.split(",")), outbox_dsn=a.outbox or None,
        network=a.network
        or ("partition" in faults and a.topology == "standalone")
        or ("split-brain" in faults and a.topology == "sentinel"),
        min_replicas=a.min_replicas, durable_leases=a.durable_leases,
        topology=a.topology, late_bound_ms=a.late_bound_ms, out=a.out,
    )  # fmt: skip
    harness = Harness(config)
    # SIGTERM ends the run as Ctrl-C does: the harness stops what it started on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = harness.run()
    print(json.dumps(checker.summary(report), indent=1))
    for anomaly in report.unexplained()[:20]:
        print(f"UNEXPLAINED {anomaly.kind} {anomaly.task}: {anomaly.detail}")
    print(f"history and result.json in {harness.out}")
    print("VALID" if report.valid else "INVALID")
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
