"""Helpers for tests: waiting on conditions instead of sleeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from delayq._core.scripts import PLAIN, Op, script


def shas(op: Op) -> frozenset[str]:
    """The SHAs a queue may send for ``op``: its script's and its plain variant's."""
    return frozenset(script(variant).sha for variant in (op, PLAIN.get(op, op)))


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
