"""The nemesis: faults on a seeded schedule, alone and overlapping (combined), each written
to the history as a ``fault`` start and stop so the checker knows its window.

Faults (``FAULTS``):

- ``consumer-kill`` / ``consumer-stop``: SIGKILL (restarted after the fault) or SIGSTOP
  (SIGCONT after it) of one consumer process; ``relay-kill``: the outbox relay's.
- ``client-clock``: one client's wall clock jumps 5 minutes ahead or back, then returns.
- ``redis-kill``: kill -9 of redis-server, restarted on its AOF after the fault (what
  survives depends on ``appendfsync``: everysec or always).
- ``redis-pause``: ``CLIENT PAUSE`` for the fault's length; ``redis-sleep``: ``DEBUG SLEEP``.
- ``maxmemory``: ``maxmemory`` just above what Redis uses, ``noeviction``: writes refused.
- ``server-clock``: Redis's clock steps 20 s ahead or back (libfaketime), then back again.
- ``partition``: on the veth pair between the clients and Redis's network namespace: a
  200 ms delay, 30% loss, the link down, or one direction dropped (``tc netem``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from .run import Harness

FAULTS = (
    "consumer-kill", "consumer-stop", "relay-kill", "client-clock", "redis-kill",
    "redis-pause", "redis-sleep", "maxmemory", "server-clock", "partition", "failover",
    "master-stop", "migrate", "split-brain",
)  # fmt: skip
NEEDS_NETWORK = frozenset({"partition", "split-brain"})
# The nemesis's own commands go once: a retried DEBUG SLEEP or CLIENT PAUSE would stretch the
# fault past the window the history records.
ONCE = Retry(NoBackoff(), 0)
FIT = {
    "standalone": frozenset(FAULTS) - {"failover", "master-stop", "migrate", "split-brain"},
    "sentinel": frozenset(FAULTS)
    - {"redis-kill", "server-clock", "partition", "migrate", "split-brain"},
    "cluster": frozenset(FAULTS) - {"redis-kill", "server-clock", "partition", "split-brain"},
    # The split-brain group (bench/soak/splitbrain.py) kills and restarts no node.
    "sentinel+network": frozenset(FAULTS)
    - {"redis-kill", "server-clock", "partition", "migrate", "failover", "master-stop"},
}
NS_PREFIX = "dqsoak-"
# Faults that change which node serves what run one at a time (other kinds still overlap
# them): a slot migrating off a master that another fault has stopped, or two masters down
# at once, left the 2-hour cluster run's cluster with a half-moved slot and masters without
# replicas, beyond what the harness could mend.
RESHAPING = frozenset({"failover", "master-stop", "migrate", "split-brain"})
# How long a migration keeps trying to finish through a stall (CLIENT PAUSE, DEBUG SLEEP).
MIGRATE_PATIENCE_S = 120.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], capture_output=True, text=True, check=False)


class Network:
    """Redis's network namespace ``dqsoak-<pid>`` and the veth pair to it: the clients'
    side ``dqs<pid>h`` (10.213.N.1) in the root namespace, Redis's ``dqs<pid>n``
    (10.213.N.2). Traffic stays on the pair; the names carry our pid so that a later run
    removes what a crashed one left (and nothing of a live one)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ns = f"{NS_PREFIX}{pid}"
        self.host_if, self.ns_if = f"dqs{pid}h", f"dqs{pid}n"
        n = _free_subnet(pid % 250 + 1)
        self.outer, self.inner = f"10.213.{n}.1", f"10.213.{n}.2"
        self.exec_prefix = ["ip", "netns", "exec", self.ns]

    @classmethod
    def create(cls) -> Network:
        net = cls(os.getpid())
        try:
            _ip("netns", "add", net.ns)
            _ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.ns_if)
            _ip("link", "set", net.ns_if, "netns", net.ns)
            _ip("addr", "add", f"{net.outer}/30", "dev", net.host_if)
            _ip("link", "set", net.host_if, "up")
            _ip("netns", "exec", net.ns, "ip", "addr", "add", f"{net.inner}/30", "dev", net.ns_if)
            _ip("netns", "exec", net.ns, "ip", "link", "set", net.ns_if, "up")
            _ip("netns", "exec", net.ns, "ip", "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            net.remove()
            raise
        return net

    def shape(self, mode: str) -> None:
        """delay / loss / down / oneway (Redis's replies dropped, requests pass)."""
        if mode == "down":
            _ip("link", "set", self.host_if, "down", check=False)
        elif mode == "oneway":
            _ip("netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", self.ns_if, "root",
                "netem", "loss", "100%", check=False)  # fmt: skip
        else:
            netem = ["delay", "200ms", "50ms"] if mode == "delay" else ["loss", "30%"]
            _tc("qdisc", "replace", "dev", self.host_if, "root", "netem", *netem)
            _ip("netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", self.ns_if, "root",
                "netem", *netem, check=False)  # fmt: skip

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up", check=False)
        _tc("qdisc", "del", "dev", self.host_if, "root")
        _ip("netns", "exec", self.ns, "tc", "qdisc", "del", "dev", self.ns_if, "root",
            check=False)  # fmt: skip

    def remove(self) -> None:
        _ip("link", "del", self.host_if, check=False)  # takes its peer with it
        _ip("netns", "del", self.ns, check=False)


def _free_subnet(first: int) -> int:
    """The first N from ``first`` on (wrapping) whose 10.213.N.0/30 no interface uses: two
    soak runs at once (the smoke beside the topology tests) must not share addresses."""
    used = _ip("-o", "addr", "show", check=False).stdout
    for k in range(250):
        n = (first - 1 + k) % 250 + 1
        if f"10.213.{n}." not in used:
            return n
    raise RuntimeError("no free 10.213.N.0/30 subnet for the soak's veth pair")


def clean_leftovers() -> None:
    """Remove namespaces and veths of earlier soak runs whose process is gone."""
    listed = _ip("netns", "list", check=False).stdout.split()
    for name in listed:
        if name.startswith(NS_PREFIX) and name[len(NS_PREFIX) :].isdigit():
            pid = int(name[len(NS_PREFIX) :])
            if not _alive(pid):
                Network(pid).remove()
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        ours = ifname.startswith("dqs") and ifname.endswith("h") and ifname[3:-1].isdigit()
        if ours and not _alive(int(ifname[3:-1])):
            _ip("link", "del", ifname, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NoTarget(Exception):
    """No node a fault can aim at now (each is down or held by another fault)."""


class Nemesis:
    """Starts a fault every ``fault_every_s`` on average (exponential gaps, seeded), each
    lasting ``fault_length_s`` on average; at most one fault of a kind at a time, so
    different kinds overlap (combined faults), except that the faults that move masters or
    slots (RESHAPING) come one at a time; every kind once before any kind twice."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness
        c = harness.config
        if c.network and c.topology == "sentinel":
            fit = FIT["sentinel+network"]
        else:
            fit = FIT[c.topology] if c.network else FIT[c.topology] - NEEDS_NETWORK
        self.faults = [f for f in c.faults if f in fit]
        if not harness.pg_dsn:
            self.faults = [f for f in self.faults if f != "relay-kill"]
        self.rnd = random.Random(c.seed * 7919)
        self._stop = threading.Event()
        self._active: set[str] = set()
        self._used: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._main = threading.Thread(target=self._schedule, daemon=True)
        self._lock = threading.Lock()
        self._number = 0
        self._open: dict[str, tuple[str, str]] = {}  # kind -> its window's name, target
        # The Redis nodes (ports) a node fault holds now (paused, asleep, full, stopped,
        # killed, cut off): a second node fault picks another node or none, instead of
        # timing out on this one or aiming at a master that is down.
        self._held: dict[int, str] = {}

    def start(self) -> None:
        self._main.start()

    def stop(self) -> None:
        """Heal everything now (each running fault ends early) and wait for it."""
        self._stop.set()
        self._main.join(5)
        for t in list(self._threads):
            t.join(60)

    def _schedule(self) -> None:
        c = self.h.config
        # Exponential gaps, capped at twice the mean: no long quiet stretch in a short run.
        while not self._stop.wait(min(self.rnd.expovariate(1 / c.fault_every_s),
                                      2 * c.fault_every_s)):  # fmt: skip
            fault = self._next_fault()
            if fault is None:
                continue
            length = min(max(self.rnd.expovariate(1 / c.fault_length_s), 0.5), 4 * c.fault_length_s)
            draw = self.rnd.random()
            self._active.add(fault)
            t = threading.Thread(target=self._run, args=(fault, length, draw), daemon=True)
            self._threads.append(t)
            t.start()

    def _next_fault(self) -> str | None:
        """The kind to start now, or None: not one already running, nor a second RESHAPING
        one; every kind once before any twice (a short run still sees each of its faults)."""
        reshaping = bool(self._active & RESHAPING)
        free = [f for f in self.faults
                if f not in self._active and not (reshaping and f in RESHAPING)]  # fmt: skip
        if not free:
            return None
        fresh = [f for f in free if f not in self._used]
        fault = self.rnd.choice(fresh or free)
        self._used.add(fault)
        return fault

    def _run(self, fault: str, length: float, draw: float) -> None:
        try:
            getattr(self, "_" + fault.replace("-", "_"))(fault, length, draw)
        except NoTarget as exc:  # nothing to aim at now: no window was opened
            self.h.rec.info("nemesis-skip", fault=fault, reason=str(exc))
        except Exception as exc:  # a fault that could not be injected is logged, not fatal
            self.h.rec.info("nemesis-error", fault=fault, error=repr(exc)[:300])
            opened = self._open.get(fault)
            if opened is not None:  # its window ends here, not at the end of the run
                self._end(opened[0], fault, opened[1])
        finally:
            self._active.discard(fault)

    # -- bookkeeping ------------------------------------------------------------------------

    def _window(self, fault: str, target: str, **detail: Any) -> str:
        with self._lock:
            self._number += 1
            name = f"{fault}-{self._number}"
        self._open[fault] = (name, target)
        self.h.rec.info("fault", id=name, fault=fault, target=target, phase="start", **detail)
        return name

    def _end(self, name: str, fault: str, target: str) -> None:
        self._open.pop(fault, None)
        self.h.rec.info("fault", id=name, fault=fault, target=target, phase="stop")

    def _hold(self, length: float) -> None:
        self._stop.wait(length)

    def _pick(self, roles: tuple[str, ...], draw: float) -> Any:
        procs = [p for p in self.h.procs if p.role in roles and p.alive() and not p.stopped]
        return procs[int(draw * len(procs))] if procs else None

    @contextlib.contextmanager
    def _holding(self, port: int, fault: str) -> Iterator[None]:
        with self._lock:
            self._held[port] = fault
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(port, None)

    def _free(self, port: int) -> bool:
        with self._lock:
            return port not in self._held

    def _redis(self, draw: float) -> tuple[redis.Redis, int]:
        """A client of a master that no other node fault holds, and its port: the master of
        the moment (Sentinel), one serving a shard (cluster), the server (standalone)."""
        topology = self.h.config.topology
        if topology == "cluster":
            node, _ = self._shard_master(draw)
            return node.client(socket_timeout=5, retry=ONCE), node.port
        if topology == "sentinel":  # the master of the moment, directly
            master = self.h.group.master()
            client: redis.Redis = master.client(socket_timeout=5, retry=ONCE)
            port = master.port
        else:
            assert self.h.server is not None
            client, port = self.h.master_client(retry=ONCE), self.h.server.port
        if not self._free(port):
            client.close()
            raise NoTarget(f"the master ({port}) is held by {self._held.get(port)}")
        return client, port

    def _shard_master(self, draw: float) -> tuple[Any, int]:
        """A cluster master serving one of the queue's shards, and that shard's slot: the
        drawn shard's, or the next one's whose master is up and held by no other fault."""
        slots = self.h.shard_slots()
        start = int(draw * len(slots))
        for slot in slots[start:] + slots[:start]:
            try:
                master = self.h.group.master_of(slot)
            except LookupError:  # its master is down and no replica took over yet
                continue
            if self._free(master.port):
                return master, slot
        raise NoTarget("every shard's master is down or held by another fault")

    # -- the faults -------------------------------------------------------------------------

    def _consumer_kill(self, fault: str, length: float, draw: float) -> None:
        self._kill(fault, length, draw, ("take", "consume", "worker", "async-worker"))

    def _relay_kill(self, fault: str, length: float, draw: float) -> None:
        self._kill(fault, length, draw, ("relay",))

    def _kill(self, fault: str, length: float, draw: float, roles: tuple[str, ...]) -> None:
        proc = self._pick(roles, draw)
        if proc is None:
            return
        name = self._window(fault, proc.base)
        proc.signal(signal.SIGKILL)
        self._hold(length)
        proc.popen.wait()
        proc.start()
        self._end(name, fault, proc.base)

    def _consumer_stop(self, fault: str, length: float, draw: float) -> None:
        proc = self._pick(("take", "consume", "worker", "async-worker"), draw)
        if proc is None:
            return
        name = self._window(fault, proc.base)
        proc.stopped = True
        proc.signal(signal.SIGSTOP)
        self._hold(length)
        proc.signal(signal.SIGCONT)
        proc.stopped = False
        self._end(name, fault, proc.base)

    def _client_clock(self, fault: str, length: float, draw: float) -> None:
        proc = self._pick(("take", "consume", "worker", "async-worker", "producer"), draw)
        if proc is None:
            return
        offset = 300 if draw * 1000 % 2 < 1 else -300
        path = self.h.skew_dir / proc.base
        name = self._window(fault, proc.base, offset_s=offset)
        path.write_text(str(offset))
        proc.signal(signal.SIGUSR1)
        self._hold(length)
        path.write_text("0")
        proc.signal(signal.SIGUSR1)
        self._end(name, fault, proc.base)

    def _redis_kill(self, fault: str, length: float, draw: float) -> None:
        server = self.h.server
        assert server is not None
        name = self._window(fault, "redis", fsync=server.fsync)
        server.kill()
        self._hold(length)
        server.start(60)
        self._end(name, fault, "redis")

    def _redis_pause(self, fault: str, length: float, draw: float) -> None:
        c, port = self._redis(draw)
        with c, self._holding(port, fault):
            name = self._window(fault, "redis", node=port)
            with contextlib.suppress(redis.RedisError):
                c.execute_command("CLIENT", "PAUSE", int(length * 1000), "ALL")
            self._hold(length)
            with contextlib.suppress(redis.RedisError):
                c.execute_command("CLIENT", "UNPAUSE")
        self._end(name, fault, "redis")

    def _redis_sleep(self, fault: str, length: float, draw: float) -> None:
        length = min(length, 3.0)  # the server is blocked for all of it: keep it short
        c, port = self._redis(draw)
        with c, self._holding(port, fault):
            name = self._window(fault, "redis", node=port)
            with contextlib.suppress(redis.RedisError):
                c.execute_command("DEBUG", "SLEEP", f"{length:.2f}")
        self._end(name, fault, "redis")

    def _maxmemory(self, fault: str, length: float, draw: float) -> None:
        c, port = self._redis(draw)
        with c, self._holding(port, fault):
            used = int(c.info("memory")["used_memory"])
            name = self._window(fault, "redis", node=port)
            c.config_set("maxmemory-policy", "noeviction")
            c.config_set("maxmemory", str(used + 64 * 1024))
            try:
                self._hold(length)
            finally:
                self._lift_maxmemory(c)
        self._end(name, fault, "redis")

    def _lift_maxmemory(self, c: redis.Redis) -> None:
        """Lift the limit, trying for a minute (a pause or a sleep of the same node, or its
        failover, can time the first try out): one left set refuses writes for the rest of
        the run."""
        patience = time.monotonic() + 60
        while True:
            try:
                c.config_set("maxmemory", "0")
                return
            except (redis.RedisError, OSError):
                if time.monotonic() > patience:
                    raise
                time.sleep(0.5)

    def _server_clock(self, fault: str, length: float, draw: float) -> None:
        server = self.h.server
        assert server is not None and server.clock_file is not None
        offset = 20 if draw * 1000 % 2 < 1 else -20
        name = self._window(fault, "redis", offset_s=offset)
        server.step_clock(offset)
        self._hold(length)
        server.step_clock(0)
        self._end(name, fault, "redis")

    def _partition(self, fault: str, length: float, draw: float) -> None:
        net = self.h.net
        assert net is not None
        mode = ("delay", "loss", "down", "oneway")[int(draw * 4)]
        name = self._window(fault, "redis", mode=mode)
        net.shape(mode)
        self._hold(min(length, 6.0))
        net.heal()
        self._end(name, fault, "redis")

    # -- Sentinel -----------------------------------------------------------------------------

    def _failover(self, fault: str, length: float, draw: float) -> None:
        """kill -9 of a master: the sentinels (or the cluster) promote its replica; the old
        master comes back as a replica after the fault (AOF replayed, then resynced)."""
        group, cluster = self.h.group, self.h.config.topology == "cluster"
        old, slot = self._shard_master(draw) if cluster else (group.master(), None)
        with self._holding(old.port, fault):
            name = self._window(fault, "redis", node=old.port)
            old.kill()
            try:
                self._promoted_and_held(old, slot, length)
            finally:  # a failover that did not come still leaves the node running again
                group.restart(old, 30)
        if cluster:
            self._mend_cluster()
        self._end(name, fault, "redis")

    def _mend_cluster(self) -> None:
        """A master that came back to find its slots taken stays an empty master (replica
        migration is off): it becomes the replica of a master that has none; then healthy."""
        for empty, orphan in self.h.group.reattach_empty_masters():
            self.h.rec.info("reattached", node=empty, master=orphan)
        self.h.group.wait_healthy(60)

    def _promoted_and_held(self, old: Any, slot: int | None, length: float) -> None:
        """Until a replica replaced ``old`` (of ``slot``'s shard on the cluster), then the
        fault's length."""
        if slot is not None:
            self.h.group.wait_for_new_master(old, 60, slot=slot)
        else:
            self.h.group.wait_for_new_master(old, 60)
        self._hold(length)

    def _master_stop(self, fault: str, length: float, draw: float) -> None:
        """SIGSTOP of a master long enough for a failover, then SIGCONT: it wakes up
        believing it is the master until it learns otherwise and becomes a replica."""
        group, cluster = self.h.group, self.h.config.topology == "cluster"
        old, slot = self._shard_master(draw) if cluster else (group.master(), None)
        with self._holding(old.port, fault):
            name = self._window(fault, "redis", node=old.port)
            old.pause()
            try:
                self._promoted_and_held(old, slot, length)
            finally:
                old.resume()
        if cluster:
            self._mend_cluster()
        else:
            group.wait_role(old, "slave", 60)
        self._end(name, fault, "redis")

    def _split_brain(self, fault: str, length: float, draw: float) -> None:
        """Cut the master and the producer beside it off from everything else until the
        sentinels have promoted a replica, and a while longer; then heal, and wait until
        the old master is a replica again (dropping what it took meanwhile)."""
        group = self.h.group
        old = group.master()
        if old.port != group.master0.port:
            return  # the master is outside the namespace now: nothing to split
        with self._holding(old.port, fault):
            name = self._window(fault, "redis", node=old.port)
            group.cut()
            try:
                group.wait_for_new_master(old, 60)
                self._hold(length)
            finally:
                group.heal_and_wait(old, 60)
        self._end(name, fault, "redis")

    def _migrate(self, fault: str, length: float, draw: float) -> None:
        """Move one shard's slot, keys and all, to another master under load."""
        group = self.h.group
        source, slot = self._shard_master(draw)
        target = next(m for m in group.masters() if m is not source)
        name = self._window(fault, "redis", slot=slot, to=target.port)
        move = group.migration(slot, target).begin()
        patience = time.monotonic() + MIGRATE_PATIENCE_S
        while True:  # a stalled MIGRATE times out: carry on, never leave the slot half-moved
            try:
                move.finish()
                break
            except (redis.RedisError, OSError) as exc:
                if time.monotonic() > patience:
                    raise
                self.h.rec.info("migrate-retry", slot=slot, error=repr(exc)[:200])
                time.sleep(1.0)
        self.h.rec.info("migrated", slot=slot, keys=move.moved)
        self._end(name, fault, "redis")
