"""Relay: :class:`AsyncRelay` for threaded programs, on an event loop of its own thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from ._relay import AsyncRelay, RelayStats


class Relay:
    """:class:`AsyncRelay` for threaded programs: :meth:`run` blocks, :meth:`start` runs it
    in a background thread named ``delayq:relay`` until :meth:`stop`. Same arguments."""

    def __init__(self, dsn: str, redis: Any = None, **options: Any) -> None:
        self._relay = AsyncRelay(dsn, redis, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    @property
    def stats(self) -> RelayStats:
        """What the relay did so far."""
        return self._relay.stats

    def run(self) -> None:
        """Relay in this thread until :meth:`stop` is called from another one."""
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started.set()
        await self._relay.run()

    def start(self) -> Relay:
        """Run the relay in a background thread; returns self."""
        if self._thread is not None:
            raise RuntimeError("this relay was already started")
        self._thread = threading.Thread(target=self.run, name="delayq:relay", daemon=True)
        self._thread.start()
        self._started.wait()
        return self

    def wait_connected(self, timeout: float = 10.0) -> bool:
        """Block until the relay listens and claims (True), or ``timeout`` passes."""
        loop = self._loop
        if loop is None:
            return False
        future = asyncio.run_coroutine_threadsafe(self._relay.connected.wait(), loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            return False
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the batch in hand and wait for the thread (if :meth:`start` ran)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed just now: nothing to stop
                loop.call_soon_threadsafe(self._relay.stop)
        else:
            self._relay.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def relay_pending(self) -> int:
        """Relay what is pending now, once (not while :meth:`start`'s thread runs)."""
        return asyncio.run(self._once())

    async def _once(self) -> int:
        try:
            return await self._relay.relay_pending()
        finally:
            await self._relay.close()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
