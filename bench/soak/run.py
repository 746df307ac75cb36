"""The soak harness: start Redis, the clients and the nemesis, run for ``duration``, heal,
drain, survey what is left, and check the history.

Everything it starts it stops (also on failure): its redis-servers, client processes,
network namespaces and PostgreSQL database carry the prefix ``dqsoak``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from delayq import DelayQueue
from delayq.exceptions import DelayqError

from . import checker, history
from .servers import Server

CONSUMERS = ("take", "take", "consume", "worker", "async-worker")
ROOT = Path(__file__).resolve().parents[2]  # clients run ``-m bench.soak.clients`` from here


@dataclass
class Config:
    duration_s: float = 60.0
    seed: int = 1
    fsync: str = "everysec"  # appendfsync of the standalone server
    faults: tuple[str, ...] = ()  # nemesis fault names (nemesis.FAULTS); () = none
    fault_every_s: float = 8.0  # mean time between fault starts
    fault_length_s: float = 4.0  # mean fault length
    rate: float = 25.0  # producer operations per second
    producers: int = 1
    consumers: tuple[str, ...] = CONSUMERS
    outbox_dsn: str | None = None  # an admin DSN: a private database is made and dropped
    visibility_timeout_s: float = 3.0
    slow_fraction: float = 0.01
    drain_s: float = 60.0
    grace_s: float = 8.0
    late_bound_ms: float = 250.0
    out: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)  # for the clients (tests' patches)
    network: bool = False  # Redis in a network namespace behind a veth pair (partitions)
    topology: str = "standalone"  # "sentinel": a master, 2 replicas, 3 sentinels; "cluster"
    shards: int = 4  # the queue's sub-queues on the cluster topology
    min_replicas: int = 0  # min-replicas-to-write of the split-brain Sentinel group
    durable_leases: int = 0  # consumers' fetches wait for this many replicas (after_fetch)


class Proc:
    """A client process; a restart is a new incarnation ``name#k`` with its own history."""

    def __init__(self, base: str, role: str, argv: list[str], env: dict[str, str]) -> None:
        self.base, self.role, self._argv, self._env = base, role, argv, env
        self.incarnation = 0
        self.popen: subprocess.Popen[bytes] | None = None
        self.stopped = False  # SIGSTOPped by the nemesis

    @property
    def name(self) -> str:
        return f"{self.base}#{self.incarnation}"

    def start(self) -> None:
        self.incarnation += 1
        self._spawn([*self._argv, "--name", self.name])

    def _spawn(self, argv: list[str]) -> None:
        hist = self._argv[self._argv.index("--history") + 1]
        with open(Path(hist).parent / "logs" / f"{self.base}.log", "ab") as log:
            self.popen = subprocess.Popen(
                argv, env=self._env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            os.kill(self.popen.pid, sig)

    def terminate(self, timeout: float = 15.0) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


FAILOVER_WINDOW_CAP_S = 60.0  # a failover-observed window ends by then, whole or not


def replication_whole(infos: Sequence[dict[str, Any] | None]) -> bool:
    """Whether a replication group is whole, from each node's ``INFO replication`` (None: no
    answer): one master, every other node its replica with the link up, and the master
    counting each of them online."""
    if any(info is None for info in infos):
        return False
    masters = [info for info in infos if info and info.get("role") == "master"]
    if len(masters) != 1:
        return False
    master = masters[0]
    replicas = [info for info in infos if info is not master]
    online = [
        value for key, value in master.items()
        if key.startswith("slave") and key[5:].isdigit() and isinstance(value, dict)
        and value.get("state") == "online"
    ]  # fmt: skip
    return len(online) == len(replicas) and all(
        info and info.get("role") == "slave" and info.get("master_link_status") == "up"
        for info in replicas
    )


class Harness:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.out = Path(config.out or f"/tmp/dqsoak-{uuid.uuid4().hex[:8]}")
        self.hist_dir = self.out / "history"
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.skew_dir = self.out / "skew"  # a client's clock offset, read on SIGUSR1
        self.skew_dir.mkdir(exist_ok=True)
        self.rec = history.Recorder(self.hist_dir, "harness")
        self.prefix = f"dqsoak{uuid.uuid4().hex[:6]}"
        self.queue = "soak"
        self.procs: list[Proc] = []
        self.server: Server | None = None
        self.group: Any = None  # tests.topology's SentinelGroup or ReplicatedCluster
        self.url = ""
        self.net: Any = None
        self.pg_dsn: str | None = None
        self._pg_db: str | None = None
        self._stop = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> checker.Report:
        with self._everything():
            self._start()
            nemesis = self._nemesis()
            sampler = threading.Thread(target=self._sample_clock, daemon=True)
            sampler.start()
            if self.config.topology == "sentinel":
                threading.Thread(target=self._watch_sentinel, daemon=True).start()
            if nemesis is not None:
                nemesis.start()
            self._stop.wait(self.config.duration_s)
            if nemesis is not None:
                nemesis.stop()
            self._drain()
            self._survey()
            self._stop.set()
            sampler.join(2)
        return self.check()

    def check(self) -> checker.Report:
        events = history.load(self.hist_dir)
        report = checker.check(
            events, grace_s=self.config.grace_s, late_bound_ms=self.config.late_bound_ms,
            min_offers=int(self.config.duration_s),  # at least one a second
        )  # fmt: skip
        result = {
            "config": {k: v for k, v in asdict(self.config).items() if k != "extra_env"},
            "summary": checker.summary(report),
            "anomalies": [asdict(a) for a in report.anomalies],
            "windows": [asdict(w) for w in report.windows],
            "recoveries": [[w.fault, w.target, r] for w, r in report.recoveries],
            "lateness": report.lateness_ms,
        }
        (self.out / "result.json").write_text(json.dumps(result, indent=1))
        return report

    @contextlib.contextmanager
    def _everything(self) -> Iterator[None]:
        from . import nemesis

        nemesis.clean_leftovers()
        try:
            yield
        finally:
            self._stop.set()
            for p in self.procs:
                with contextlib.suppress(Exception):
                    p.terminate(5)
            if self.server is not None:
                self.server.stop()
            if self.group is not None:
                self.group.stop()
            if self.net is not None:
                self.net.remove()
            self._drop_database()
            self.rec.close()

    def _start(self) -> None:
        from . import nemesis

        c = self.config
        fake = "server-clock" in c.faults
        if c.topology == "sentinel" and c.network:
            from .splitbrain import SplitGroup

            self.group = SplitGroup(c.fsync, c.min_replicas).start()
            url = self.group.url
        elif c.topology == "sentinel":
            # The topology toolkit of the fault tests, written once (tests/topology.py).
            from tests.topology import SentinelGroup

            self.group = SentinelGroup(
                aof=True, extra_args=["--appendfsync", c.fsync, "--enable-debug-command", "yes"]
            ).start()
            url = self.group.url
        elif c.topology == "cluster":
            from tests.topology import ReplicatedCluster

            self.group = ReplicatedCluster(masters=3, replicas_per_master=1, aof=True)
            for node in self.group.nodes:  # later options win: the run's appendfsync
                node.extra_args += ["--appendfsync", c.fsync, "--enable-debug-command", "yes"]
            self.group.start()
            url = self.group.url
            self._create_sharded(url)
        elif c.network:
            self.net = nemesis.Network.create()
            self.server = Server(
                fsync=c.fsync, host=self.net.inner, prefix=self.net.exec_prefix, fake_clock=fake
            )
        else:
            self.server = Server(fsync=c.fsync, fake_clock=fake)
        if self.server is not None:
            self.server.start()  # kept first, so that a failed start is still cleaned up
            url = self.server.url
        self.url = url
        if c.outbox_dsn:
            self._create_database(c.outbox_dsn)
        common = [
            sys.executable, "-m", "bench.soak.clients", "--url", url, "--queue", self.queue,
            "--prefix", self.prefix, "--history", str(self.hist_dir),
            "--visibility-timeout", str(c.visibility_timeout_s), "--skew-dir", str(self.skew_dir),
        ]  # fmt: skip
        for k in range(c.producers):
            extra = ["--rate", str(c.rate), "--slow-fraction", str(c.slow_fraction)]
            if c.fsync == "always":
                extra.append("--durable-all")
            if self.group is not None:  # half the offers durable: every replica the leases need
                extra += ["--replicas", str(max(1, c.durable_leases))]
            self._add(f"producer-{k}", "producer", [*common, *extra, "--seed", str(c.seed + k)])
        if c.topology == "sentinel" and c.network:
            # A producer beside the master, in its namespace, on a plain URL: cut off with it.
            inside = [*self.group.net.exec_prefix, *common, "--rate", str(c.rate / 2),
                      "--replicas", str(max(1, c.durable_leases)),
                      "--seed", str(c.seed + 50)]  # fmt: skip
            inside[inside.index("--url") + 1] = self.group.inside_url
            self._add("producer-inside", "producer", inside)
        leases = []
        if c.durable_leases and self.group is not None:
            leases = ["--fetch-replicas", str(c.durable_leases)]
        for k, role in enumerate(c.consumers):
            self._add(f"{role}-{k}", role, [*common, *leases, "--seed", str(c.seed * 100 + k)])
        if self.pg_dsn:
            ox = ["--dsn", self.pg_dsn, "--rate", "4"]
            self._add("outbox-producer-0", "outbox-producer", [*common, *ox])
            relay_waits = []
            if self.group is not None:  # the relay deletes rows once the replicas have them
                relay_waits = ["--wait-replicas", str(max(1, c.durable_leases))]
            self._add("relay-0", "relay", [
                sys.executable, "-m", "delayq.cli", "relay", "--dsn", self.pg_dsn,
                "--redis", url, "--sweep-interval", "1", "--log-level", "WARNING",
                *relay_waits, "--history", str(self.hist_dir),
            ])  # fmt: skip
        for p in self.procs:
            p.start()

    def _create_sharded(self, url: str) -> None:
        """Record the sharded layout before any client starts (consumers follow it)."""
        queue = DelayQueue(self.queue, url, prefix=self.prefix, shards=self.config.shards)
        try:
            queue.offer({}, 3600, id="dqsoak-layout")
            queue.cancel("dqsoak-layout")
        finally:
            queue.close()

    def shard_slots(self) -> list[int]:
        """The cluster slot of each sub-queue."""
        from delayq._core import sharding

        names = sharding.shard_names(self.queue, self.config.shards)
        return [sharding.key_slot(name) for name in names]

    def _add(self, base: str, role: str, argv: list[str]) -> None:
        if role == "relay":
            # delayq relay takes neither --history nor --name: strip them at start.
            proc: Proc = _Relay(base, role, argv, {**os.environ, **self.config.extra_env})
        else:
            at = argv.index("bench.soak.clients") + 1
            argv = [*argv[:at], role, *argv[at:]]
            proc = Proc(base, role, argv, {**os.environ, **self.config.extra_env})
        self.procs.append(proc)

    def _nemesis(self) -> Any:
        if not self.config.faults:
            return None
        from .nemesis import Nemesis

        return Nemesis(self)

    # -- the clock samples ------------------------------------------------------------------

    def master_client(self, **options: Any) -> redis.Redis:
        """A client of the current master (through the sentinels on that topology; on the
        cluster, the master of the first shard's slot)."""
        if self.config.topology == "sentinel":
            client: redis.Redis = self.group.master_for(socket_timeout=2, **options)
            return client
        if self.config.topology == "cluster":
            node = self.group.master_of(self.shard_slots()[0])
            cluster_client: redis.Redis = node.client(socket_timeout=2, **options)
            return cluster_client
        assert self.server is not None
        return redis.Redis(
            host=self.server.host, port=self.server.port, socket_timeout=2,
            socket_connect_timeout=1, **options,
        )  # fmt: skip

    def _sample_clock(self) -> None:
        client: redis.Redis | None = None
        while not self._stop.is_set():
            try:
                client = client or self.master_client()
                t0 = time.monotonic()
                seconds, micros = client.time()
                t1 = time.monotonic()
                self.rec.info(
                    "clock", t=(t0 + t1) / 2, server_ms=seconds * 1000 + micros / 1000,
                    rtt=t1 - t0,
                )  # fmt: skip
            except Exception:  # an outage or a failover: find the master again
                if client is not None:
                    client.close()
                client = None
            self._stop.wait(0.1)
        if client is not None:
            client.close()

    def _watch_sentinel(self) -> None:
        """Record every failover the sentinels make, whatever caused it (a paused or blocked
        master is a failover too), as a ``failover-observed`` fault window: from the first
        sign (the master subjectively down) until the group is whole again (or 60 s).

        Whole, not merely reachable: the old master comes back believing it is the master,
        and Sentinel makes it a replica only some 8-10 s later (it waits for newer configs
        first). Until then the new master has one replica fewer, so a ``Durability`` that
        asks for every replica cannot be met: that wait is the failover's, not delayq's."""
        host, port = self.group.sentinel_addresses[0]
        window: dict[str, Any] = {}
        number = 0
        while not self._stop.is_set():
            try:
                with redis.Redis(host=host, port=port, socket_timeout=1) as client:
                    pubsub = client.pubsub()
                    pubsub.psubscribe("*")
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=0.25)
                        now = time.monotonic()
                        if window and now - window["t"] > FAILOVER_WINDOW_CAP_S:
                            self._observed(window, "stop", why="cap")
                            window = {}
                        elif window and self._group_whole():
                            self._observed(window, "stop", why="whole")
                            window = {}
                        if not message or message["type"] != "pmessage":
                            continue
                        event = message["channel"].decode()
                        data = message["data"].decode()
                        # A sentinel that missed the master's silence still hears of
                        # the switch that the others made.
                        if not window and (
                            event == "+switch-master"
                            or (
                                event in ("+sdown", "+odown", "+try-failover")
                                and data.startswith("master")
                            )
                        ):
                            number += 1
                            window = {"id": f"failover-observed-{number}", "t": now}
                            self._observed(window, "start", event=f"{event} {data}")
            except (redis.RedisError, OSError):
                self._stop.wait(0.5)
        if window:
            self._observed(window, "stop", why="end")

    def _group_whole(self) -> bool:
        infos: list[dict[str, Any] | None] = []
        for node in self.group.nodes:
            try:
                with node.client(socket_timeout=0.5, socket_connect_timeout=0.5) as c:
                    infos.append(c.info("replication"))
            except (redis.RedisError, OSError):
                infos.append(None)
        return replication_whole(infos)

    def _observed(self, window: dict[str, Any], phase: str, **detail: Any) -> None:
        self.rec.info("fault", id=window["id"], fault="failover-observed", target="redis",
                      phase=phase, **detail)  # fmt: skip

    # -- the end ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Stop the producers, let the consumers empty the queue (and the relay the outbox),
        then stop the consumers."""
        for p in self.procs:
            if p.role in ("producer", "outbox-producer"):
                p.terminate()
        self._mend_topology()
        for p in self.procs:  # whatever the nemesis left stopped or dead, back to work
            p.signal(signal.SIGCONT)
            if not p.alive() and p.role not in ("producer", "outbox-producer"):
                p.start()
        deadline = time.monotonic() + self.config.drain_s
        queue = self._queue()
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    s = queue.stats()
                    if s.delayed + s.ready + s.inflight == 0 and self._outbox_empty():
                        break
                time.sleep(0.5)
        finally:
            queue.close()
        for p in self.procs:
            if p.role not in ("producer", "outbox-producer"):
                p.terminate()

    def _mend_topology(self) -> None:
        """Every data node running and awake, and the topology settled, before the drain and
        the survey: a fault that failed half way (logged as a nemesis-error) may have left a
        node stopped, and the survey reads every shard."""
        group = self.group
        if group is None or not hasattr(group, "restart"):  # the split-brain group heals itself
            return
        try:
            for node in group.nodes:
                if not node.running:
                    group.restart(node, 30)
                else:
                    node.resume()
            if self.config.topology == "cluster":
                for empty, orphan in group.reattach_empty_masters():
                    self.rec.info("reattached", node=empty, master=orphan)
                group.wait_healthy(120)
            elif hasattr(group, "wait_settled"):
                group.wait_settled(60)
        except Exception as exc:  # the survey says what it could not read
            self.rec.info("mend-error", error=repr(exc)[:300])

    def _queue(self) -> DelayQueue:
        return DelayQueue(self.queue, self.url, prefix=self.prefix)

    def _survey(self) -> None:
        """Where every task ever offered is now: gone, or its state."""
        ids: set[str] = set()
        for e in history.load(self.hist_dir):
            if e.f == "offer" and e.type == history.INVOKE:
                ids.add(e.value["id"])
            elif e.f == "outbox" and e.type != history.INVOKE:
                ids.update(e.value.get("ids", []))
        queue = DelayQueue(self.queue, self.url, prefix=self.prefix, reconnect_timeout=5)
        patience = time.monotonic() + 120  # for the whole survey, through a topology settling
        try:
            states = survey_states(queue, sorted(ids), patience)
        finally:
            queue.close()
        self.rec.info("final", states=states)

    @staticmethod
    def _state_of(queue: DelayQueue, task_id: str, patience: float) -> str:
        """The task's state, retried through Redis errors until ``patience`` (monotonic)
        runs out; then ``unreadable`` (the checker reports it as stuck, never as settled)."""
        while True:
            try:
                info = queue.get(task_id)
                return "gone" if info is None else str(info.state)
            except DelayqError:
                if time.monotonic() > patience:
                    return "unreadable"
                time.sleep(0.5)

    # -- PostgreSQL ---------------------------------------------------------------------------

    def _create_database(self, admin_dsn: str) -> None:
        import psycopg

        from delayq.outbox import Outbox

        name = f"dqsoak_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        self._pg_db = name
        base = admin_dsn.rpartition("/")[0]
        self.pg_dsn = f"{base}/{name}"
        Outbox(self.pg_dsn, prefix=self.prefix).install()

    def _outbox_empty(self) -> bool:
        if not self.pg_dsn:
            return True
        from delayq.outbox import Outbox

        return Outbox(self.pg_dsn, prefix=self.prefix).status().pending == 0

    def _drop_database(self) -> None:
        if not self._pg_db or not self.config.outbox_dsn:
            return
        import psycopg

        with (
            contextlib.suppress(Exception),
            psycopg.connect(self.config.outbox_dsn, autocommit=True) as admin,
        ):
            admin.execute(f'DROP DATABASE IF EXISTS "{self._pg_db}" WITH (FORCE)')


class _Relay(Proc):
    """``delayq relay`` itself: it writes no history (its effects are the consumers')."""

    def start(self) -> None:
        self.incarnation += 1
        argv = list(self._argv)
        at = argv.index("--history")
        del argv[at : at + 2]
        self._spawn(argv)


# Unreadable tasks in a row after which the survey stops asking: a shard whose slot no master
# serves (a cluster the harness could not mend) would otherwise cost a reconnect timeout per
# task, for hours.
GIVE_UP_AFTER = 50


def survey_states(queue: Any, ids: Sequence[str], patience: float) -> dict[str, str]:
    """Each id's state (Harness._state_of); once GIVE_UP_AFTER in a row were unreadable after
    ``patience``, the rest are ``unreadable`` without a call (the checker counts them stuck,
    never settled)."""
    states: dict[str, str] = {}
    in_a_row = 0
    for task_id in ids:
        if in_a_row >= GIVE_UP_AFTER:
            states[task_id] = "unreadable"
            continue
        states[task_id] = Harness._state_of(queue, task_id, patience)
        in_a_row = in_a_row + 1 if states[task_id] == "unreadable" else 0
    return states
