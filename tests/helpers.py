"""Helpers for tests: waiting on conditions instead of sleeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def delayq_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("delayq:")]
