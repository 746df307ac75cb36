"""Worker options that override the queue's lease and retry policy."""

from __future__ import annotations

import threading

import pytest

from delayq import Backoff, ConfigError, DelayQueue, Worker

from ..helpers import wait_until


def test_worker_overrides_visibility_timeout_and_attempts(make_queue) -> None:
    q: DelayQueue = make_queue(visibility_timeout=60, max_attempts=10)
    leases: list[float] = []

    def handler(task) -> None:  # type: ignore[no-untyped-def]
        info = q.get(task.id)
        assert info is not None and info.lease_expires_at is not None
        leases.append((info.lease_expires_at - task.delivered_at).total_seconds())
        raise RuntimeError("always fails")

    worker = Worker(
        q,
        handler,
        handle_signals=False,
        visibility_timeout=2,
        max_attempts=2,
        retry_backoff=Backoff(base=0.05, max=0.05),
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    q.offer("job")
    try:
        wait_until(lambda: q.stats().dead == 1, timeout=10)
    finally:
        worker.stop()
        runner.join(10)
    assert len(leases) == 2 and all(1.5 <= lease <= 2.5 for lease in leases), leases
    assert q.dead()[0].attempts == 2


def test_worker_refuses_a_lease_for_an_at_most_once_queue(make_queue) -> None:
    q: DelayQueue = make_queue(ack=False)
    with pytest.raises(ConfigError, match="at-most-once"):
        Worker(q, lambda task: None, visibility_timeout=5)
