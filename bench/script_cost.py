"""Redis time per fetch and per ack call (one task each, or --batch): the full scripts
against the plain ones, and, given a JSON of older sources, against those; all interleaved on
one private redis-server, EVALSHA's ``usec_per_call`` from ``INFO commandstats`` reset per round.

    python -m bench.script_cost [OLD.json] [--calls 1000] [--rounds 12] [--batch 1]

``OLD.json`` holds ``{"fetch": source, "ack": source}`` of another tree's scripts (see
docs/benchmarks-core.md), whose fetch takes the arguments of commit 9757503 (no consumer).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import redis

from delayq import Backoff, DelayQueue
from delayq._core import protocol
from delayq._core.keys import QueueKeys
from delayq._core.protocol import Policy
from delayq._core.scripts import Op, script
from delayq.embedded import EmbeddedRedis

NAME, PREFIX = "cost", "dq-cost"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("old", type=Path, nargs="?", help="JSON of older fetch and ack sources")
    parser.add_argument("--calls", type=int, default=1000, help="calls per round and script")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=1, help="tasks per fetch and per ack")
    args = parser.parse_args(argv)
    sources = {
        "full": (script(Op.FETCH).source, script(Op.ACK).source),
        "plain": (script(Op.FETCH_PLAIN).source, script(Op.ACK_PLAIN).source),
    }
    if args.old:
        old = json.loads(args.old.read_text())
        sources = {"old": (old["fetch"], old["ack"]), **sources}
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        queue = DelayQueue(NAME, redis=server.url, prefix=PREFIX)
        try:
            got = _measure(client, queue, sources, args.calls, args.rounds, args.batch)
        finally:
            queue.close()
    for name in sorted(got):
        values = got[name]
        print(
            f"{name:11}: median {statistics.median(values):6.1f} us per call  "
            f"(min {min(values):.1f}, max {max(values):.1f})"
        )
    return 0


def _measure(
    client: redis.Redis,
    queue: DelayQueue,
    sources: dict[str, tuple[str, str]],
    calls: int,
    rounds: int,
    batch: int,
) -> dict[str, list[float]]:
    keys = QueueKeys(PREFIX, NAME)
    policy = Policy(30_000, 5, Backoff())
    shas = {name: tuple(client.script_load(s) for s in pair) for name, pair in sources.items()}

    def per_call() -> float:
        return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])

    got: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, (fetch, ack) in shas.items():
            features = () if name == "old" else keys.features  # as each tree's client sends
            for _ in range(0, calls * batch, 1000):
                queue.offer_many([("x", 0)] * min(1000, calls * batch))
            leased = []
            client.config_resetstat()
            for _ in range(calls):
                fetch_args = protocol.fetch_args(policy, batch, 15_000)
                if name == "old":
                    fetch_args = fetch_args[:9]  # before the histories' consumer argument
                receipt = keys.receipt("fetch", fetch_args[2])
                reply: Any = client.evalsha(
                    fetch, 14 + len(features), *keys.all, receipt, *features, *fetch_args
                )
                leased.append(
                    [x for r in range(3, len(reply), 6) for x in (reply[r], reply[r + 5])]
                )
            got.setdefault(f"{name} fetch", []).append(per_call())
            client.config_resetstat()
            for pairs in leased:
                receipt = keys.receipt("ack", protocol.new_nonce())
                acked = client.evalsha(
                    ack, 14 + len(features), *keys.all, receipt, *features, 15_000, *pairs
                )
                if acked != [1] * batch:
                    raise SystemExit(f"{name} ack of {pairs[::2]!r} answered {acked!r}")
            got.setdefault(f"{name} ack", []).append(per_call())
    return got


if __name__ == "__main__":
    raise SystemExit(main())
