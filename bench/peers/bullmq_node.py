"""BullMQ for Node (npm ``bullmq``) as a peer-benchmark contestant, driven by Node scripts.

``bench/node/`` holds the npm project (``npm ci --prefix bench/node`` installs it) and its two
scripts: ``enqueue.js`` reads the payloads as JSON on stdin, adds them with
``queue.add(name, data, {delay})`` one by one or ``queue.addBulk`` in chunks of :data:`CHUNK`,
and prints the seconds its add calls took (Node's start-up, connecting and reading the input are
not counted); ``worker.js`` is one ``Worker`` at its defaults (concurrency 1) whose processor
writes the start line with ``Date.now() / 1000`` (millisecond resolution).

BullMQ keeps delayed jobs in a sorted set; a worker blocks on the queue's marker key until the
next due time (sub-second BZPOPMIN timeouts on Redis >= 6). A job held by a dead worker goes back
once its lock (30 s) has expired and a stalled-jobs check (every 30 s) has seen it twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.peers.base import ROOT, Contestant, Job, payload

NODE_DIR = ROOT / "bench" / "node"
#: addBulk is given the jobs in chunks of this many (as delayq's offer_many in delayq_peer)
CHUNK = 1000


def node() -> str | None:
    return shutil.which("node")


class BullmqNode(Contestant):
    name = "bullmq-node"
    settings = (
        "defaults: Worker concurrency 1 (so it holds 1 job at a time), lockDuration 30 s, "
        "stalledInterval 30 s, maxStalledCount 1; job options default (completed jobs kept); "
        "ioredis connection with maxRetriesPerRequest null (what BullMQ requires of a Worker "
        f"connection); addBulk in chunks of {CHUNK}; times by Date.now() (1 ms resolution)"
    )

    def version(self) -> str:
        parts = []
        for pkg in ("bullmq", "ioredis"):
            try:
                meta = json.loads((NODE_DIR / "node_modules" / pkg / "package.json").read_text())
                parts.append(f"{pkg} {meta['version']}")
            except (OSError, ValueError, KeyError):
                parts.append(f"{pkg} ?")
        exe = node()
        if exe:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
            parts.append(f"node {out.stdout.strip().lstrip('v')}")
        return ", ".join(parts)

    def unavailable(self) -> str | None:
        if node() is None:
            return "no `node` on PATH (BullMQ for Node needs Node.js)"
        if not (NODE_DIR / "node_modules" / "bullmq" / "package.json").exists():
            return f"bullmq not installed: run `npm ci --prefix {NODE_DIR.relative_to(ROOT)}`"
        return None

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        exe = node()
        if exe is None:
            raise RuntimeError(self.unavailable())
        data = json.dumps([payload(j) for j in jobs])
        argv = [exe, str(NODE_DIR / "enqueue.js"), url, queue, "1" if bulk else "0", str(CHUNK)]
        proc = subprocess.run(argv, input=data, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"enqueue.js exited {proc.returncode}: {proc.stderr[-1500:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if result["n"] != len(jobs):
            raise RuntimeError(f"enqueue.js added {result['n']} of {len(jobs)} jobs")
        return float(result["seconds"])

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        exe = node() or "node"
        script = str(Path(NODE_DIR / "worker.js"))
        return [exe, script, url, queue, sink, "1" if hold else "0"]
