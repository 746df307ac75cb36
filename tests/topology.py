"""Test topologies: a Sentinel group and a replicated Redis Cluster, with fault helpers.

Every process is an :class:`~delayq.embedded.EmbeddedRedis` (a private server on a free
127.0.0.1 port, its data in a temporary directory) plus what a fault test needs: SIGSTOP and
SIGCONT, a restart on the same port and data directory, and waits on the topology's own view
(Sentinel's ``get-master-addr-by-name``, the cluster's ``CLUSTER NODES``) instead of sleeps.

Sentinel has a TILT mode: when its timer fires more than 2 s late (a loaded 2-core machine, a
SIGSTOPped test process) it stops acting for 30 s, so a failover that "never happens" is
often TILT. Every wait that fails says whether a sentinel was or had been in TILT.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from delayq.embedded import EmbeddedRedis, _free_cluster_port, find_redis_server

T = TypeVar("T")
HOST = "127.0.0.1"
# Replicas sync at once (the default waits 5 s for more replicas to share a diskless sync).
REPLICATION_ARGS = ["--repl-diskless-sync-delay", "0"]


class TopologyTimeout(AssertionError):
    """A topology did not reach the state a test waited for; the message says what it saw."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    diagnose: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``predicate`` until it returns a truthy value, tolerating Redis errors while the
    topology moves; on timeout raise :class:`TopologyTimeout` naming ``what`` and
    ``diagnose()``'s account of the topology."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = diagnose()
            raise TopologyTimeout(
                f"{what}: not within {timeout}s"
                + (f" (last error: {last_error!r})" if last_error else "")
                + (f"; {detail}" if detail else "")
            )
        time.sleep(0.05)


class Node(EmbeddedRedis):
    """One server of a topology: an EmbeddedRedis that can also be paused and resumed."""

    @property
    def pid(self) -> int:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"node {self.port} is not running")
        return self._proc.pid

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets open but answers nothing (a hung host)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        os.kill(self.pid, signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> Node:
        """Start again on the same port and data directory (after a kill or a terminate)."""
        self.kill()
        self.start(timeout)
        return self

    def client(self, **options: Any) -> redis.Redis:
        """A plain client to this one node; short timeouts so a paused node cannot hang a test."""
        options.setdefault("socket_timeout", 1.0)
        options.setdefault("socket_connect_timeout", 1.0)
        return redis.Redis(host=HOST, port=self.port, **options)

    def command(self, *args: Any) -> Any:
        """Run one command on a fresh connection (no callbacks: raw replies)."""
        with self.client() as c:
            return c.execute_command(*args)

    def info(self, section: str) -> dict[str, str]:
        """``INFO section`` as a dict of strings."""
        with self.client() as c:
            return {k: str(v) for k, v in c.info(section).items()}

    def role(self) -> str:
        """``master`` or ``slave``, from the node itself."""
        return self.info("replication")["role"]

    def log_text(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.dir, "redis.log")) as f:
            return f.read()
        return ""


class SentinelProcess(Node):
    """``redis-server --sentinel`` with a config file it may rewrite (Sentinel insists)."""

    def __init__(self, binary: str, config: list[str]) -> None:
        super().__init__(binary)
        self.config_path = os.path.join(self.dir, "sentinel.conf")
        with open(self.config_path, "w") as f:
            f.write("\n".join(config) + "\n")

    def _args(self) -> list[str]:
        return [
            self.binary, self.config_path, "--sentinel",
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
        ]  # fmt: skip

    def in_tilt(self) -> bool:
        return self.info("sentinel").get("sentinel_tilt") == "1"


class SentinelGroup:
    """A master, its replicas and the sentinels that watch them, all on 127.0.0.1.

    ``down_after_ms`` is how long the master may be silent before a sentinel calls it down;
    with the defaults a killed master is replaced in about 2-4 s. ``aof=True`` gives every data
    node an append-only file fsynced on every write.
    """

    SERVICE = "delayq-ha"

    def __init__(
        self,
        binary: str | None = None,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        aof: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.nodes = [
            Node(self.binary, aof=aof, extra_args=[*REPLICATION_ARGS, *(extra_args or [])])
            for _ in range(1 + replicas)
        ]
        master = self.nodes[0]
        for node in self.nodes[1:]:
            node.extra_args += ["--replicaof", HOST, str(master.port)]
        config = [
            f"sentinel monitor {self.SERVICE} {HOST} {master.port} {quorum}",
            f"sentinel down-after-milliseconds {self.SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {self.SERVICE} {failover_timeout_ms}",
            f"sentinel parallel-syncs {self.SERVICE} {replicas}",
        ]
        self.sentinels = [SentinelProcess(self.binary, config) for _ in range(sentinels)]

    # -- addresses and clients --------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.sentinels]

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of this group (issue #10's form)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.SERVICE}"

    def sentinel(self, **options: Any) -> Sentinel:
        """A redis-py ``Sentinel`` over every sentinel of the group."""
        options.setdefault("socket_timeout", 1.0)
        return Sentinel(self.sentinel_addresses, **options)

    def master_for(self, **options: Any) -> redis.Redis:
        """A redis-py client that asks the sentinels for the master (``master_for``)."""
        options.setdefault("socket_timeout", 2.0)
        return self.sentinel(sentinel_kwargs={"socket_timeout": 1.0}).master_for(
            self.SERVICE, **options
        )

    def async_master_for(self, **options: Any) -> redis.asyncio.Redis:
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        options.setdefault("socket_timeout", 2.0)
        sentinel = AsyncSentinel(self.sentinel_addresses, sentinel_kwargs={"socket_timeout": 1.0})
        return sentinel.master_for(self.SERVICE, **options)

    def node_at(self, port: int) -> Node:
        for node in self.nodes:
            if node.port == port:
                return node
        raise LookupError(f"no data node on port {port}")

    # -- the sentinels' view ----------------------------------------------------------------

    def _live_sentinels(self) -> list[SentinelProcess]:
        return [s for s in self.sentinels if s.running]

    def reported_masters(self) -> set[int]:
        """The master port each live sentinel reports (one port when they agree)."""
        ports = set()
        for s in self._live_sentinels():
            with s.client() as c:
                _host, port = c.sentinel_get_master_addr_by_name(self.SERVICE)
            ports.add(int(port))
        return ports

    def settled(self) -> bool:
        """Whether no live sentinel is in the middle of a failover or sees the master down
        (a failover's leader reports the new address before it has reconfigured the
        replicas and the old master)."""
        for s in self._live_sentinels():
            with s.client() as c:
                flags = set(c.sentinel_master(self.SERVICE)["flags"].split(","))
            if flags & {"failover_in_progress", "s_down", "o_down"}:
                return False
        return True

    def master(self) -> Node:
        """The node the sentinels agree is the master, and which says so itself."""
        ports = self.reported_masters()
        if len(ports) != 1:
            raise LookupError(f"sentinels disagree on the master: {sorted(ports)}")
        return self.node_at(ports.pop())

    def replicas(self) -> list[Node]:
        master = self.master()
        return [n for n in self.nodes if n is not master]

    def diagnose(self) -> str:
        """What the sentinels see, for failure messages: masters reported, TILT, flags."""
        parts = []
        for s in self.sentinels:
            if not s.running:
                parts.append(f"sentinel {s.port}: not running")
                continue
            try:
                tilt = "TILT NOW" if s.in_tilt() else "no tilt"
                with s.client() as c:
                    fields = c.sentinel_master(self.SERVICE)
                flags, port = fields["flags"], fields["port"]
                parts.append(f"sentinel {s.port}: master {port} [{flags}], {tilt}")
            except (redis.RedisError, OSError) as exc:
                parts.append(f"sentinel {s.port}: {exc!r}")
            log = s.log_text()
            if "+tilt" in log:
                parts.append(f"sentinel {s.port} entered TILT during the test (see its log)")
            aborts = sorted(set(re.findall(r"-failover-abort-[a-z-]+", log)))
            if aborts:
                parts.append(f"sentinel {s.port} aborted failovers: {', '.join(aborts)}")
        for n in self.nodes:
            try:
                parts.append(f"node {n.port}: {n.role() if n.running else 'down'}")
            except (redis.RedisError, OSError) as exc:
                parts.append(f"node {n.port}: {type(exc).__name__}")
        return "; ".join(parts)

    def tilted(self) -> list[int]:
        """Ports of sentinels that entered TILT at any point (their logs say ``+tilt``)."""
        return [s.port for s in self.sentinels if "+tilt" in s.log_text()]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> SentinelGroup:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # never leave half a group running
            raise

    def _start(self, timeout: float) -> SentinelGroup:
        for node in self.nodes:
            node.start()
        self.wait_replicas_synced(self.nodes[0], timeout)
        for s in self.sentinels:
            s.start()
        replicas, others = len(self.nodes) - 1, len(self.sentinels) - 1

        def everyone_known() -> bool:
            for s in self.sentinels:
                with s.client() as c:
                    info = c.sentinel_master(self.SERVICE)
                if info["num-slaves"] < replicas or info["num-other-sentinels"] < others:
                    return False
            return True

        # Sentinels find replicas from the master's INFO (every 10 s at first; at once on
        # start) and each other by hello messages every 2 s.
        wait_for(everyone_known, timeout, "sentinels to know every replica and sentinel")
        return self

    def wait_replicas_synced(self, master: Node, timeout: float = 20.0) -> None:
        """Until every other running data node is a replica of ``master`` with its link up."""

        def synced() -> bool:
            for node in self.nodes:
                if node is master or not node.running:
                    continue
                info = node.info("replication")
                if info.get("role") != "slave" or info.get("master_port") != str(master.port):
                    return False
                if info.get("master_link_status") != "up":
                    return False
            return True

        wait_for(synced, timeout, f"replicas to sync from {master.port}", self.diagnose)

    def wait_for_new_master(self, old: Node, timeout: float = 30.0) -> Node:
        """Until every live sentinel reports one master other than ``old``, none is still
        failing over, and that node says it is a master; returns it."""

        def promoted() -> Node | None:
            ports = self.reported_masters()
            if len(ports) != 1 or old.port in ports or not self.settled():
                return None
            node = self.node_at(ports.pop())
            return node if node.role() == "master" else None

        return wait_for(promoted, timeout, f"a new master in place of {old.port}", self.diagnose)

    def wait_settled(self, timeout: float = 30.0) -> Node:
        """Until every live sentinel reports the same master, none is failing over, and that
        node says it is a master; returns it."""

        def agreed() -> Node | None:
            ports = self.reported_masters()
            if len(ports) != 1 or not self.settled():
                return None
            node = self.node_at(ports.pop())
            return node if node.running and node.role() == "master" else None

        return wait_for(agreed, timeout, "the sentinels to agree on a master", self.diagnose)

    def wait_role(self, node: Node, role: str, timeout: float = 30.0) -> None:
        """Until ``node`` itself reports ``role`` (``master`` or ``slave``) with a live link."""

        def has_role() -> bool:
            info = node.info("replication")
            linked = role == "master" or info.get("master_link_status") == "up"
            return info.get("role") == role and linked

        wait_for(has_role, timeout, f"node {node.port} to become {role}", self.diagnose)

    def failover(self, timeout: float = 45.0) -> Node:
        """A graceful ``SENTINEL FAILOVER``; returns the new master once every sentinel
        agrees. A forced failover the sentinel aborts (on a loaded machine the replica's
        promotion can outlast ``failover-timeout``: ``-failover-abort-slave-timeout``) is never
        retried by Sentinel itself, so it is asked again while time remains."""
        old = self.master()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._live_sentinels()[0].command("SENTINEL", "FAILOVER", self.SERVICE)
            except redis.ResponseError as exc:
                if "INPROG" not in str(exc) and "NOGOODSLAVE" not in str(exc):
                    raise
            attempt = min(deadline - time.monotonic(), self.failover_timeout_ms / 1000 + 10)
            try:
                return self.wait_for_new_master(old, max(attempt, 1.0))
            except TopologyTimeout:
                if time.monotonic() + 1.0 > deadline:
                    raise

    def restart(self, node: Node, timeout: float = 10.0) -> Node:
        """Start ``node`` again on its port and directory, as a replica of the master the
        sentinels report (what Sentinel's CONFIG REWRITE gives a real deployment)."""
        node.kill()
        current = self.master()
        node.extra_args = _without_option(node.extra_args, "--replicaof", 2)
        if current is not node:
            node.extra_args += ["--replicaof", HOST, str(current.port)]
        node.start(timeout)
        return node

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _without_option(args: list[str], option: str, values: int) -> list[str]:
    """``args`` without every ``option`` and the ``values`` arguments after it."""
    out, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg == option:
            skip = values
        else:
            out.append(arg)
    return out


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One line of ``CLUSTER NODES``: a node as some node of the cluster sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags and "fail" not in self.flags

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterView]:
    """Parse ``CLUSTER NODES`` (the same on Redis 6.2, 7.x and Valkey)."""
    views = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        address = fields[1].split("@")[0]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: a migration in progress
                continue
            lo, _, hi = item.partition("-")
            slots.append((int(lo), int(hi or lo)))
        views.append(
            ClusterView(
                node_id=fields[0],
                port=int(address.rsplit(":", 1)[1]),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(slots),
            )
        )
    return views


class ReplicatedCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas_per_master`` replicas each.

    Slots are split evenly over the first ``masters`` nodes; a killed master is replaced by
    its replica after ``node_timeout_ms`` plus an election (about 3-4 s with the default).
    Works on Redis 6.2 (no ``CLUSTER SHARDS`` or ``ADDSLOTSRANGE`` is used).
    """

    SLOTS = 16384

    def __init__(
        self,
        binary: str | None = None,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 2000,
        aof: bool = False,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.master_count = masters
        self.replicas_per_master = replicas_per_master
        self.nodes: list[Node] = []
        for _ in range(masters * (1 + replicas_per_master)):
            node = Node(self.binary, port=_free_cluster_port(), aof=aof)
            node.extra_args = [
                "--cluster-enabled", "yes",
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-config-file", os.path.join(node.dir, "nodes.conf"),
                # A replica may always stand in for its master, however stale (tests want the
                # failover, not the data-age check); replicas never wander to other masters.
                "--cluster-replica-validity-factor", "0",
                "--cluster-allow-replica-migration", "no",
                *REPLICATION_ARGS,
            ]  # fmt: skip
            self.nodes.append(node)
        self.ids: dict[int, str] = {}

    # -- addresses and clients --------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL of this cluster (issue #10's form)."""
        return "redis+cluster://" + ",".join(f"{HOST}:{n.port}" for n in self.nodes)

    def client(self, **options: Any) -> RedisCluster:
        """A redis-py ``RedisCluster`` that knows every node as a startup node."""
        options.setdefault("socket_timeout", 2.0)
        options.setdefault("socket_connect_timeout", 1.0)
        nodes = [ClusterNode(HOST, n.port) for n in self.nodes]
        return RedisCluster(startup_nodes=nodes, **options)

    def async_client(self, **options: Any) -> redis.asyncio.RedisCluster:
        from redis.asyncio.cluster import ClusterNode as AsyncClusterNode

        options.setdefault("socket_timeout", 2.0)
        options.setdefault("socket_connect_timeout", 1.0)
        nodes = [AsyncClusterNode(HOST, n.port) for n in self.nodes]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, **options)

    def node_at(self, port: int) -> Node:
        for node in self.nodes:
            if node.port == port:
                return node
        raise LookupError(f"no cluster node on port {port}")

    # -- the cluster's view -----------------------------------------------------------------

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.running]

    def view(self, seen_by: Node | None = None) -> list[ClusterView]:
        """``CLUSTER NODES`` as ``seen_by`` (default: the first live node) sees it."""
        observer = seen_by or self.live_nodes()[0]
        return parse_cluster_nodes(observer.command("CLUSTER", "NODES").decode())

    def masters(self) -> list[Node]:
        """The nodes that own slots, as the first live node sees it."""
        return [self.node_at(v.port) for v in self.view() if v.is_master and v.slots]

    def master_of(self, slot: int) -> Node:
        for v in self.view():
            if v.is_master and v.owns(slot):
                return self.node_at(v.port)
        raise LookupError(f"no master owns slot {slot}")

    def replicas_of(self, master: Node) -> list[Node]:
        master_id = self.ids[master.port]
        return [self.node_at(v.port) for v in self.view() if v.master_id == master_id]

    def diagnose(self) -> str:
        parts = []
        for node in self.nodes:
            if not node.running:
                parts.append(f"{node.port}: down")
                continue
            try:
                views = {v.port: ",".join(sorted(v.flags)) for v in self.view(node)}
                parts.append(f"{node.port} (state {_cluster_state(node)}) sees {views}")
            except (redis.RedisError, OSError) as exc:
                parts.append(f"{node.port}: {type(exc).__name__}")
        return "; ".join(parts)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ReplicatedCluster:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise

    def _start(self, timeout: float) -> ReplicatedCluster:
        for node in self.nodes:
            node.start()
            self.ids[node.port] = node.command("CLUSTER", "MYID").decode()
        masters = self.nodes[: self.master_count]
        per_master = -(-self.SLOTS // len(masters))
        for i, node in enumerate(masters):
            first = i * per_master
            node.command("CLUSTER", "ADDSLOTS", *range(first, min(first + per_master, self.SLOTS)))
        for node in self.nodes[1:]:
            self.nodes[0].command("CLUSTER", "MEET", HOST, node.port)
        wait_for(
            lambda: all(len(self.view(n)) == len(self.nodes) for n in self.nodes),
            timeout,
            "every node to know every other",
            self.diagnose,
        )
        replicas = self.nodes[self.master_count :]
        for i, replica in enumerate(replicas):
            master = masters[i % self.master_count]
            replica.command("CLUSTER", "REPLICATE", self.ids[master.port])
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok``, agrees on which nodes are masters,
        sees every live replica as one, and every live replica's link to its master is up."""

        def healthy() -> bool:
            views = []
            for node in self.live_nodes():
                if _cluster_state(node) != "ok":
                    return False
                if node.role() == "slave" and (
                    node.info("replication").get("master_link_status") != "up"
                ):
                    return False
                seen = self.view(node)
                replicas = [v for v in seen if v.master_id and "fail" not in v.flags]
                if len(replicas) != len(self.live_nodes()) - self.master_count:
                    return False
                views.append(sorted(v.port for v in seen if v.is_master and v.slots))
            return all(v == views[0] for v in views) and len(views[0]) == self.master_count

        wait_for(healthy, timeout, "a healthy cluster", self.diagnose)

    def reattach_empty_masters(
        self, tried: list[tuple[int, int]] | None = None
    ) -> list[tuple[int, int]]:
        """Each live master that serves no slot (it came back after a failover to find its
        slots taken, and replica migration is off) becomes the replica of a master that has
        no live replica; returns the (node, master) ports paired. Each pair is also appended
        to ``tried`` before its ``CLUSTER REPLICATE`` is sent, so a caller that retries on
        errors still knows what a call that raised may have done."""
        view = self.view()
        serving = [v for v in view if v.is_master and v.slots and "fail" not in v.flags]
        followed = {v.master_id for v in view if v.master_id and "fail" not in v.flags}
        orphans = [v for v in serving if v.node_id not in followed]
        empties = [
            v
            for v in view
            if v.is_master and not v.slots and "fail" not in v.flags
            if self.node_at(v.port).running
        ]
        pairs = []
        for empty, orphan in zip(empties, orphans, strict=False):
            if tried is not None:
                tried.append((empty.port, orphan.port))
            self.node_at(empty.port).command("CLUSTER", "REPLICATE", orphan.node_id)
            pairs.append((empty.port, orphan.port))
        return pairs

    def first_slot(self, master: Node) -> int:
        """The first slot ``master`` serves, as another node sees it."""
        view = next(v for v in self.view(self._observer(master)) if v.port == master.port)
        if not view.slots:
            raise ValueError(f"node {master.port} serves no slot")
        return view.slots[0][0]

    def wait_for_new_master(
        self, old: Node, timeout: float = 30.0, *, slot: int | None = None
    ) -> Node:
        """Until a node other than ``old`` serves ``slot`` (default: ``old``'s first slot,
        which must still be in the cluster's view), every other live node agrees and says
        ``cluster_state:ok``; returns the new master."""
        if slot is None:
            slot = self.first_slot(old)

        def promoted() -> Node | None:
            owners = set()
            for node in self.live_nodes():
                if node is old:
                    continue
                if _cluster_state(node) != "ok":
                    return None
                owners |= {v.port for v in self.view(node) if v.is_master and v.owns(slot)}
            if len(owners) != 1 or old.port in owners:
                return None
            new = self.node_at(owners.pop())
            return new if new.role() == "master" else None

        return wait_for(promoted, timeout, f"a new master in place of {old.port}", self.diagnose)

    def _observer(self, not_this: Node) -> Node:
        return next(n for n in self.live_nodes() if n is not not_this)

    def failover(self, replica: Node, option: str | None = None, timeout: float = 30.0) -> Node:
        """``CLUSTER FAILOVER [FORCE|TAKEOVER]`` on ``replica``; returns it once it is the
        master everywhere."""
        old = next(
            self.node_at(v.port) for v in self.view() if v.node_id == self._master_id_of(replica)
        )
        slot = self.first_slot(old)
        replica.command("CLUSTER", "FAILOVER", *([option] if option else []))
        new = self.wait_for_new_master(old, timeout, slot=slot)
        if new is not replica:
            raise TopologyTimeout(f"{new.port} took over from {old.port}, not {replica.port}")
        return new

    def _master_id_of(self, replica: Node) -> str:
        view = next(v for v in self.view() if v.port == replica.port)
        if view.master_id is None:
            raise ValueError(f"node {replica.port} is not a replica")
        return view.master_id

    def restart(self, node: Node, timeout: float = 10.0) -> Node:
        """Start ``node`` again on its port and directory (its ``nodes.conf`` keeps its id)."""
        return node.restart(timeout)

    # -- slot migration ---------------------------------------------------------------------

    def migration(self, slot: int, target: Node) -> SlotMigration:
        """A stepwise migration of ``slot`` to ``target`` (see :class:`SlotMigration`)."""
        return SlotMigration(self, slot, self.master_of(slot), target)

    def migrate_slot(self, slot: int, target: Node, batch: int = 100) -> int:
        """Move ``slot`` and its keys to ``target`` in one go; returns the keys moved."""
        with self.migration(slot, target) as move:
            moved = move.all_keys(batch)
        return moved

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> ReplicatedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_state(node: Node) -> str:
    text = node.command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split()).get("cluster_state", "?")


class SlotMigration:
    """A slot moving between masters, step by step, for ASK and TRYAGAIN tests.

    ``begin()`` marks the slot IMPORTING on the target and MIGRATING on the source; from then
    on clients get ASK for keys already moved (and TRYAGAIN for multi-key calls whose keys are
    split). ``move(batch)`` MIGRATEs up to ``batch`` keys; ``finish()`` assigns the slot to the
    target on every master. As a context manager: begin on entry, finish on exit.
    """

    def __init__(self, cluster: ReplicatedCluster, slot: int, source: Node, target: Node) -> None:
        if source is target:
            raise ValueError(f"slot {slot} is already on {target.port}")
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target
        self.moved = 0

    def begin(self) -> SlotMigration:
        ids = self.cluster.ids
        self.target.command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", ids[self.source.port])
        self.source.command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", ids[self.target.port])
        return self

    def keys_left(self) -> int:
        return int(self.source.command("CLUSTER", "COUNTKEYSINSLOT", self.slot))

    def move(self, batch: int = 100) -> int:
        """MIGRATE up to ``batch`` keys of the slot; returns how many moved."""
        keys = self.source.command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
        if keys:
            self.source.command(
                "MIGRATE", HOST, self.target.port, "", 0, 5000, "REPLACE", "KEYS", *keys
            )
        self.moved += len(keys)
        return len(keys)

    def all_keys(self, batch: int = 100) -> int:
        while self.move(batch):
            pass
        return self.moved

    def finish(self) -> None:
        """Assign the slot to the target: target first, then source, then the other masters
        (the order redis-cli uses, so no node is left thinking nobody owns it)."""
        target_id = self.cluster.ids[self.target.port]
        self.all_keys()
        self.target.command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        self.source.command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        for node in self.cluster.masters():
            if node not in (self.source, self.target):
                node.command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)

    def __enter__(self) -> SlotMigration:
        return self.begin()

    def __exit__(self, *exc: object) -> None:
        self.finish()


@contextlib.contextmanager
def running(topology: SentinelGroup | ReplicatedCluster) -> Iterator[Any]:
    """Start ``topology``, yield it, stop every process of it afterwards (fixture helper)."""
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()
