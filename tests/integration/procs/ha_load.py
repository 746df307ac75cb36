"""Drives the failover scenarios' load: a producer process and worker processes, and the
ledger they write, read back into a :class:`Tally` (offered, handled, lost, duplicated).

The processes are ``ha_producer.py`` and ``ha_worker.py`` next to this file. They record into
a ledger Redis that is not part of the topology under test, so a failover cannot lose the
record of what happened.
"""

from __future__ import annotations

import itertools
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).parent


class Proc:
    """A helper subprocess; a thread reads its output so every wait on it is bounded."""

    def __init__(self, script: str, *args: str) -> None:
        self.name = script
        self.popen = subprocess.Popen(
            [sys.executable, "-u", str(HERE / script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.output.append(line)
            self._lines.put(line)

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        """The next output line starting with ``prefix``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(
            f"{self.name} printed no {prefix!r} line within {timeout}s "
            f"(exit code {self.popen.poll()}); output: {self.output[-30:]}"
        )

    def terminate(self, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def cleanup(self) -> None:
        self.kill()
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def log(self, contains: str = "") -> list[str]:
        return [line for line in self.output if contains in line]


@dataclass
class Tally:
    """What the ledger says happened."""

    offered: dict[str, int]  # id -> wall ms its offer returned
    handled: dict[str, list[dict[str, Any]]]  # id -> every handler run that finished
    errors: list[dict[str, Any]] = field(default_factory=list)  # producer's failed tries

    @property
    def lost(self) -> list[str]:
        """Offers that returned but whose task no handler ever finished."""
        return sorted(set(self.offered) - set(self.handled))

    @property
    def duplicated(self) -> list[str]:
        """Tasks whose handler ran to the end more than once."""
        return sorted(i for i, runs in self.handled.items() if len(runs) > 1)

    @property
    def unexpected(self) -> list[str]:
        """Handled tasks the producer never saw offered (an offer that raised yet took)."""
        return sorted(set(self.handled) - set(self.offered))

    @property
    def overlapping(self) -> list[str]:
        """Tasks two handler runs held at the same time: two leases at once."""
        found = []
        for task_id, runs in self.handled.items():
            spans = sorted((r["start_ms"], r["end_ms"]) for r in runs)
            if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):
                found.append(task_id)
        return found

    def handled_by(self) -> Counter[int]:
        return Counter(r["pid"] for runs in self.handled.values() for r in runs)

    def first_handled_after(self, wall_ms: int) -> int | None:
        """The end time of the first handler run that started after ``wall_ms``."""
        ends = [r["end_ms"] for runs in self.handled.values() for r in runs]
        later = [e for e in ends if e > wall_ms]
        return min(later) if later else None

    def longest_offer_gap_ms(self) -> int:
        """The longest wait between two offers returning: the producer's outage."""
        times = sorted(self.offered.values())
        return max((b - a for a, b in itertools.pairwise(times)), default=0)

    def error_kinds(self) -> Counter[str]:
        return Counter(e["error"] for e in self.errors)

    def summary(self) -> str:
        return (
            f"offered {len(self.offered)}, handled {len(self.handled)}, lost {len(self.lost)}, "
            f"duplicated {len(self.duplicated)}, unexpected {len(self.unexpected)}, "
            f"overlapping leases {len(self.overlapping)}, producer errors "
            f"{dict(self.error_kinds())}, longest offer gap {self.longest_offer_gap_ms()} ms"
        )


class HaLoad:
    """A producer and worker processes on ``target`` (see ha_client.py), queues under
    ``prefix``, recording into the ledger Redis at ``ledger_url``."""

    def __init__(
        self,
        target: str,
        ledger_url: str,
        prefix: str,
        queues: list[str],
        *,
        kind: str = "thread",
        visibility_s: float = 5.0,
        safety_interval_s: float = 0.5,
    ) -> None:
        self.target, self.ledger_url, self.prefix = target, ledger_url, prefix
        self.queues = ",".join(queues)
        self.kind, self.visibility_s = kind, visibility_s
        self.safety_interval_s = safety_interval_s
        self.workers: list[Proc] = []
        self.producers: list[Proc] = []
        self.ledger = redis.Redis.from_url(ledger_url)

    def start_workers(self, count: int = 2, max_seconds: float = 120.0) -> None:
        for _ in range(count):
            worker = Proc(
                "ha_worker.py", self.target, self.prefix, self.queues, self.ledger_url,
                "--kind", self.kind, "--visibility", str(self.visibility_s),
                "--safety", str(self.safety_interval_s),
                "--max-seconds", str(max_seconds),
            )  # fmt: skip
            self.workers.append(worker)
        for worker in self.workers:
            worker.expect("ready", 30)

    def start_producer(
        self,
        count: int,
        *,
        rate: float = 100.0,
        delay_s: float = 0.3,
        first: int = 0,
        max_seconds: float = 90.0,
        durable: int = 0,
    ) -> Proc:
        producer = Proc(
            "ha_producer.py", self.target, self.prefix, self.queues, self.ledger_url,
            "--count", str(count), "--rate", str(rate), "--delay", str(delay_s),
            "--first", str(first), "--max-seconds", str(max_seconds),
            "--durable", str(durable),
        )  # fmt: skip
        self.producers.append(producer)
        producer.expect("ready", 30)
        return producer

    def offered_count(self) -> int:
        return int(self.ledger.llen(f"{self.prefix}:offered"))

    def wait_offered(self, at_least: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.offered_count() < at_least:
            if time.monotonic() > deadline:
                said = [p.output[-10:] for p in self.producers]
                raise AssertionError(
                    f"fewer than {at_least} offers within {timeout}s; the producers said {said}"
                )
            time.sleep(0.02)

    def wait_producers(self, timeout: float = 90.0) -> None:
        """Until every producer started so far has offered all its tasks and exited 0."""
        for producer in self.producers:
            if producer.popen.poll() == 0 and any(x.startswith("done") for x in producer.output):
                continue
            producer.expect("done", timeout)
            assert producer.popen.wait(10) == 0, producer.output[-20:]

    def wait_all_handled(self, timeout: float = 30.0) -> Tally:
        """Until every offer that returned has been handled; the tally either way."""
        deadline = time.monotonic() + timeout
        while True:
            tally = self.tally()
            if not tally.lost or time.monotonic() > deadline:
                return tally
            time.sleep(0.1)

    def tally(self) -> Tally:
        offered = {}
        for raw in self.ledger.lrange(f"{self.prefix}:offered", 0, -1):
            record = json.loads(raw)
            offered[record["id"]] = record["at_ms"]
        handled: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for raw in self.ledger.lrange(f"{self.prefix}:handled", 0, -1):
            record = json.loads(raw)
            handled[record["id"]].append(record)
        errors = [json.loads(r) for r in self.ledger.lrange(f"{self.prefix}:errors", 0, -1)]
        return Tally(offered, dict(handled), errors)

    def worker_log(self, contains: str) -> list[str]:
        return [line for w in self.workers for line in w.log(contains)]

    def stop(self) -> None:
        """SIGTERM the workers (they hand back what they hold) and end every process."""
        for proc in [*self.producers, *self.workers]:
            try:
                proc.terminate(30)
            finally:
                proc.cleanup()
        self.ledger.close()

    def __enter__(self) -> HaLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
