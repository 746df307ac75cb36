"""A Sentinel group whose master sits in a network namespace, with a producer beside it:
cutting the veth link isolates the master and that producer from the sentinels, the
replicas and every other client (a split brain). The sentinels promote a replica; the old
master keeps taking the nearby producer's writes until the link comes back and the
sentinels make it a replica of the new master, which discards what it took meanwhile.

Nodes outside the namespace listen on the veth's outer address (10.213.N.1), so that the old
master, inside, can reach the new one to resync.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import Sentinel

from .nemesis import Network
from .servers import Server

SERVICE = "dqsoak"


class _Node:
    """What the nemesis asks of a node (tests/topology.py's Node has the same face)."""

    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def port(self) -> int:
        return self.server.port

    def client(self, **options: Any) -> redis.Redis:
        options.setdefault("socket_timeout", 2)
        return redis.Redis(host=self.server.host, port=self.server.port, **options)

    def role(self) -> str:
        with self.client() as c:
            return str(c.info("replication")["role"])


class SplitGroup:
    def __init__(self, fsync: str, min_replicas: int = 0) -> None:
        self.net = Network.create()
        replication = ["--repl-diskless-sync-delay", "0", "--enable-debug-command", "yes"]
        if min_replicas:
            # A lag of 2 s: replicas ack every second; a demoted master whose replicas moved
            # to the new one refuses writes (NOREPLICAS) 2 s after, not 5 (the window in
            # which its leases and offers are confirmed by a replica about to leave it).
            replication += ["--min-replicas-to-write", str(min_replicas),
                            "--min-replicas-max-lag", "2"]  # fmt: skip
        self.master0 = Server(
            fsync=fsync, host=self.net.inner, prefix=self.net.exec_prefix, extra=replication
        )
        self.replicas = [
            Server(fsync=fsync, host=self.net.outer,
                   extra=[*replication, "--replicaof", self.net.inner, str(self.master0.port)])
            for _ in range(2)
        ]  # fmt: skip
        self.nodes = [_Node(s) for s in (self.master0, *self.replicas)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.sentinel_ports: list[int] = []
        self._dirs: list[str] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"{self.net.outer}:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(self.net.outer, p) for p in self.sentinel_ports]

    @property
    def inside_url(self) -> str:
        """The old master, as the producer inside the namespace reaches it."""
        return self.master0.url

    def start(self) -> SplitGroup:
        try:
            self.master0.start()
            for r in self.replicas:
                r.start()
            self._start_sentinels()
            self._wait(lambda: self.master().port == self.master0.port, 30, "sentinels agree")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinels(self) -> None:
        from delayq.embedded import find_redis_server, free_port

        for _ in range(3):
            port = free_port()
            directory = self.master0.dir + f"-sentinel-{port}"
            os.makedirs(directory)
            self._dirs.append(directory)
            conf = Path(directory) / "sentinel.conf"
            conf.write_text("\n".join([
                f"sentinel monitor {SERVICE} {self.net.inner} {self.master0.port} 2",
                f"sentinel down-after-milliseconds {SERVICE} 1000",
                f"sentinel failover-timeout {SERVICE} 3000",
                f"sentinel parallel-syncs {SERVICE} 2",
            ]) + "\n")  # fmt: skip
            self.sentinels.append(subprocess.Popen(
                [find_redis_server(), str(conf), "--sentinel", "--port", str(port), "--bind",
                 self.net.outer, "--dir", directory, "--logfile", f"{directory}/redis.log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
            self.sentinel_ports.append(port)

    def sentinel(self) -> Sentinel:
        return Sentinel([(self.net.outer, p) for p in self.sentinel_ports], socket_timeout=1)

    def master_for(self, **options: Any) -> redis.Redis:
        client: redis.Redis = self.sentinel().master_for(SERVICE, **options)
        return client

    def master(self) -> _Node:
        """The node the sentinels name as the master."""
        _, port = self.sentinel().discover_master(SERVICE)
        return next(n for n in self.nodes if n.port == int(port))

    def _wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if predicate():
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{what}: not within {timeout}s")

    def cut(self) -> None:
        """Isolate the master (and whoever is in its namespace)."""
        self.net.shape("down")

    def heal_and_wait(self, old: _Node, timeout: float = 60) -> None:
        self.net.heal()
        self._wait(lambda: old.role() == "slave", timeout, "the old master demoted")

    def wait_for_new_master(self, old: _Node, timeout: float = 60) -> None:
        self._wait(lambda: self.master().port != old.port, timeout, "a new master")

    def stop(self) -> None:
        for p in self.sentinels:
            with contextlib.suppress(OSError):
                p.kill()
                p.wait(5)
        for s in (self.master0, *self.replicas):
            s.stop()
        import shutil

        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.net.remove()
