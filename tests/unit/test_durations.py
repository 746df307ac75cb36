"""Every duration delayq takes is seconds or a ``timedelta`` (one converter,
``_core.timing``): the workers' ``timeout`` and ``grace``, ``Durability(timeout=...)`` and
the background handle's ``stop(timeout=...)``. A bad one is a ``ConfigError`` naming it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from delayq import ConfigError, Durability
from delayq._core.timing import setting_s
from delayq._workers.background import BackgroundWorker
from delayq._workers.common import WorkerOptions


def test_setting_s_takes_seconds_and_timedeltas() -> None:
    assert setting_s(2, "grace") == 2.0
    assert setting_s(0.25, "grace") == 0.25
    assert setting_s(timedelta(minutes=1, milliseconds=500), "grace") == 60.5
    assert setting_s(0, "grace") == 0.0
    for bad, message in [
        (0, "timeout must be > 0"),
        (-1, "timeout must be > 0"),
        (timedelta(seconds=-1), "timeout must be > 0"),
        ("30", "timeout must be seconds"),
        (True, "timeout must be seconds"),
        (float("nan"), "timeout must be finite"),
    ]:
        with pytest.raises(ConfigError, match=message):
            setting_s(bad, "timeout", allow_zero=False)


def test_worker_timeout_and_grace_take_timedeltas() -> None:
    options = WorkerOptions.build(1, 8, timedelta(minutes=2), timedelta(seconds=5), None, None)
    assert (options.timeout, options.grace) == (120.0, 5.0)
    options = WorkerOptions.build(1, 8, None, 0, None, None)
    assert (options.timeout, options.grace) == (None, 0.0)


@pytest.mark.parametrize(
    ("timeout", "grace", "message"),
    [
        (0, 30, "timeout must be > 0"),
        ("60", 30, "timeout must be seconds"),
        (None, -1, "grace must be >= 0"),
        (None, timedelta(days=-1), "grace must be >= 0"),
        (None, "30", "grace must be seconds"),
    ],
)
def test_a_bad_worker_duration_is_a_config_error_naming_it(
    timeout: object, grace: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerOptions.build(1, 8, timeout, grace, None, None)  # type: ignore[arg-type]


def test_durability_timeout_takes_a_timedelta_and_reads_back_seconds() -> None:
    durable = Durability(timeout=timedelta(milliseconds=200))
    assert durable == Durability(timeout=0.2)
    assert (durable.timeout, durable.timeout_s, durable.timeout_ms) == (0.2, 0.2, 200)
    assert Durability(timeout=timedelta(minutes=1)).timeout_ms == 60_000
    for bad in (0, timedelta(0), timedelta(seconds=61), "1", float("inf")):
        with pytest.raises(ConfigError, match="timeout"):
            Durability(timeout=bad)  # type: ignore[arg-type]


class FakeWorker:
    """What a BackgroundWorker runs: ``run()`` until ``stop()``."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def run(self) -> None:
        self.stopped.wait(10)

    def stop(self) -> None:
        self.stopped.set()


def test_background_stop_takes_a_timedelta() -> None:
    worker = FakeWorker()
    handle = BackgroundWorker(worker)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout must be >= 0"):
        handle.stop(timeout=-1)
    assert handle.running and not worker.stopped.is_set()  # a bad timeout stops nothing
    handle.stop(timeout=timedelta(seconds=5))
    assert not handle.running


def test_a_workers_concurrency_is_split_across_its_queues() -> None:
    def handlers(queues: int, concurrency: int) -> tuple[int, ...]:
        return WorkerOptions.build(queues, concurrency, None, 0, None, None).handlers

    assert handlers(1, 8) == (8,)
    assert handlers(2, 3) == (2, 1)  # what does not divide goes to the first queues
    assert handlers(3, 8) == (3, 3, 2)
    assert handlers(3, 1) == (1, 1, 1)  # at least one each
