"""Both workers' bookkeeping against a real Redis: the heartbeat racing an ack, and the thread
Worker's refusal of a handler that returns an awaitable instead of doing the work."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from delayq import DelayQueue
from delayq._core.scripts import Op, script
from delayq.embedded import EmbeddedRedis
from tests.helpers import shas, wait_until
from tests.integration.test_worker import (  # noqa: F401 - fixtures
    KINDS,
    Harness,
    Step,
    done,
    harness,
    inspect7,
)


class _ExtendAfterAck:
    """Wraps a client's ``execute_command`` so that the heartbeat's first EXTEND is sent only
    once an ACK has been answered: the heartbeat took its list while the task ran, and the
    task's ack landed before the extend reached Redis."""

    def __init__(self, client: Any, is_async: bool) -> None:
        self.extend_waiting = threading.Event()  # the first extend is held back
        self.acked = threading.Event()
        extend, acks = script(Op.EXTEND).sha, shas(Op.ACK)
        original = client.execute_command

        def first_extend(args: tuple[Any, ...]) -> bool:
            if args[:2] != ("EVALSHA", extend) or self.extend_waiting.is_set():
                return False
            self.extend_waiting.set()
            return True

        if is_async:

            async def run_async(*args: Any, **options: Any) -> Any:
                if first_extend(args):
                    while not self.acked.is_set():
                        await asyncio.sleep(0.005)
                reply = await original(*args, **options)
                if args[0] == "EVALSHA" and args[1] in acks:
                    self.acked.set()
                return reply

            client.execute_command = run_async
        else:

            def run_sync(*args: Any, **options: Any) -> Any:
                if first_extend(args):
                    self.acked.wait(10)
                reply = original(*args, **options)
                if args[0] == "EVALSHA" and args[1] in acks:
                    self.acked.set()
                return reply

            client.execute_command = run_sync


@pytest.mark.parametrize("kind", KINDS)
def test_an_ack_landing_during_the_heartbeat_is_not_reported_as_a_lost_lease(
    kind: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,  # noqa: F811 - a fixture
    harness: Callable[..., Harness],  # noqa: F811 - a fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the heartbeat's extend of a task acked since it took its list failed with
    LeaseLost, and the worker logged "lease on X expired while held" for a task done fine."""
    caplog.set_level(logging.WARNING, logger="delayq.worker")
    wrapped: list[_ExtendAfterAck] = []
    h = harness(
        kind,
        redis7_server.url,
        lambda task: Step(sleep=30),  # runs until h.release
        concurrency=1,
        wrap_client=lambda client, is_async: wrapped.append(_ExtendAfterAck(client, is_async)),
        queue_options={"visibility_timeout": 1.5},  # a heartbeat every 0.5 s
    )
    task_id = inspect7.offer("job")
    wait_until(lambda: bool(wrapped) and wrapped[0].extend_waiting.is_set(), timeout=5)
    assert [c.id for c in h.calls] == [task_id]  # listed by the heartbeat while it ran
    h.release.set()  # the handler returns; its ack goes ahead of the held-back extend
    wait_until(lambda: wrapped[0].acked.is_set(), timeout=5)
    wait_until(lambda: h.worker._ledger.held() == 0 and done(inspect7), timeout=5)
    h.stop()
    assert inspect7.stats().counters.get("acked") == 1
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "lease" in m], messages
    assert h.health().succeeded == 1 and h.health().internal_errors == 0


# -- a plain function that returns an awaitable ------------------------------------------------


async def _side_effect(ran: list[str], task_id: str) -> None:
    ran.append(task_id)


@pytest.mark.parametrize("wrapper", ["plain", "partial"])
def test_thread_worker_dead_letters_a_task_whose_handler_returned_a_coroutine(
    wrapper: str,
    redis7_server: EmbeddedRedis,
    inspect7: DelayQueue,  # noqa: F811 - a fixture
    harness: Callable[..., Harness],  # noqa: F811 - a fixture
    caplog: pytest.LogCaptureFixture,
    recwarn: pytest.WarningsRecorder,
) -> None:
    """A sync wrapper around an async def passes the construction check (it is a plain
    function), then returns a coroutine that nothing in a thread awaits. Before: the task was
    acked unrun (the work lost, a "never awaited" warning the only trace). Now: the coroutine
    is closed and the task dead-lettered at once, once, with an error that says what to do."""
    caplog.set_level(logging.ERROR, logger="delayq.worker")
    ran: list[str] = []

    def returns_a_coroutine(task: Any) -> Step:
        if wrapper == "partial":
            return Step(result=functools.partial(_side_effect, ran)(task.id))
        return Step(result=_side_effect(ran, task.id))

    h = harness("thread", redis7_server.url, returns_a_coroutine, max_attempts=5)
    task_id = inspect7.offer("job")
    wait_until(lambda: inspect7.stats().dead == 1, timeout=5)
    (dead,) = inspect7.dead()
    assert dead.id == task_id and dead.attempts == 1  # dead at the first attempt: no retry
    assert dead.error is not None
    assert "AsyncWorker" in dead.error and "coroutine" in dead.error, dead.error
    assert "was not handled" in dead.error
    h.stop()
    assert ran == []  # the body never ran
    assert h.attempts_of("job") == [1]
    health = h.health()
    assert (health.succeeded, health.dead) == (0, 1)
    assert inspect7.stats().counters.get("acked", 0) == 0
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
    logged = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert len(logged) == 1 and "AsyncWorker" in logged[0]
