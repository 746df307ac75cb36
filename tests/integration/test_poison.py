"""No task's data can stop a worker (issue #14): a handler error that cannot be encoded, a task
id that is not UTF-8, hostile text in errors, and faults in the worker's own loops.

The workers run in background threads through the :class:`Harness` of ``test_worker``; the
faults are injected through the public ``metrics=`` recorder or by patching one method of the
worker class. Every wait is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Worker, WorkerFailed
from delayq.embedded import EmbeddedRedis
from delayq.metrics import NoopMetrics, WorkerMetrics
from tests.helpers import wait_until
from tests.integration.test_worker import KINDS, Harness, Step

SURROGATE_ERROR = "bad \udcff file name"  # as decoded with surrogateescape
RAW_ID = b"\xff\xfe"  # not UTF-8: planted by another client
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def workers(prefix: str) -> Iterator[Callable[..., Harness]]:
    """Start workers in background threads; every one is stopped at the end of the test."""
    made: list[Harness] = []

    def make(kind: str, url: str, behave: Callable[[Any], Step], **options: Any) -> Harness:
        h = Harness(
            kind,
            url,
            prefix,
            behave,
            queue_options=options.pop("queue_options", {}),
            worker_options={"grace": 2.0, **options},
        )
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.close()


@pytest.fixture
def q7(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[DelayQueue]:
    """The workers' queue (``w``) on the Redis 7 server, for offering and looking: the worker
    tests are about the worker, not the server version."""
    q = DelayQueue("w", redis7_server.url, prefix=prefix)
    yield q
    q.close()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def plant_raw_id(client: redis.Redis, q: DelayQueue | AsyncDelayQueue, envelope: bytes) -> None:
    """A due task whose id is not UTF-8, written straight into the queue's keys (the layout of
    keys.py: the delayed ZSET scores are due ms * 10 + slot, 9 being priority 0)."""
    client.hset(q.keys.key("tasks"), RAW_ID, envelope)
    client.zadd(q.keys.key("delayed"), {RAW_ID: (server_ms(client) - 1000) * 10 + 9})


def envelope_of(client: redis.Redis, q: DelayQueue, payload: Any) -> bytes:
    """The stored bytes of a real task with ``payload`` (offered, read, then cancelled)."""
    task_id = q.offer(payload, 3600)
    envelope = client.hget(q.keys.key("tasks"), task_id)
    assert envelope is not None and q.cancel(task_id)
    return bytes(envelope)


def poisoned(payload: Any) -> Callable[[Any], Step]:
    """A handler that fails ``payload``'s task with a message that is not valid UTF-8."""

    def behave(task: Any) -> Step:
        return Step(error=RuntimeError(SURROGATE_ERROR)) if task.payload == payload else Step()

    return behave


def handled(h: Harness) -> set[Any]:
    return {c.payload for c in list(h.calls)}


def settled(q: DelayQueue) -> bool:
    s = q.stats()
    return s.delayed == s.ready == s.inflight == 0


# -- the surrogate error ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_error_with_a_lone_surrogate_is_retried_then_dead_lettered(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    tmp_path: Path,
) -> None:
    """Before: recording the failure raised UnicodeEncodeError and killed a handler slot, the
    task came back after each lease and killed another, healthy tasks stayed in flight."""
    health_file = tmp_path / "health.json"
    h = workers(
        kind, redis7_server.url, poisoned("poison"),
        concurrency=2, max_attempts=3, health_file=str(health_file),
    )  # fmt: skip
    q7.offer("poison")
    q7.offer_many([(i, 0) for i in range(20)])
    wait_until(lambda: handled(h) >= set(range(20)) and q7.stats().dead == 1, timeout=15)
    wait_until(lambda: settled(q7), timeout=15)

    assert h.attempts_of("poison") == [1, 2, 3]
    (dead,) = q7.dead()
    assert dead.payload == "poison"
    assert dead.error is not None and "RuntimeError: bad \\udcff file name" in dead.error
    # The worker counts a verdict once Redis has answered it: Redis may show it first.
    counts = lambda: (h.health().succeeded, h.health().failed, h.health().dead)  # noqa: E731
    wait_until(lambda: counts() == (20, 3, 1), timeout=5)
    health = h.health()
    assert health.alive and health.reason is None
    assert health.internal_errors == 0 and health.loop_restarts == 0
    wait_until(lambda: json.loads(health_file.read_text())["succeeded"] == 20, timeout=5)
    assert json.loads(health_file.read_text())["alive"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_retry_and_reject_reasons_that_cannot_be_encoded_are_recorded(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
) -> None:
    """Retry and Reject reasons go to Redis as the task's last error: escaped, not fatal."""
    from delayq import Reject, Retry

    def behave(task: Any) -> Step:
        if task.payload == "retry" and task.attempts == 1:
            return Step(error=Retry(0, reason="again \udc80"))
        if task.payload == "reject":
            return Step(error=Reject("no \udcfe"))
        return Step()

    h = workers(kind, redis7_server.url, behave)
    retried, rejected = q7.offer("retry"), q7.offer("reject")
    wait_until(lambda: q7.stats().dead == 1 and h.attempts_of("retry") == [1, 2], timeout=15)
    wait_until(lambda: settled(q7), timeout=15)
    (dead,) = q7.dead()
    assert dead.id == rejected and dead.error == "rejected: no \\udcfe"
    assert q7.get(retried) is None  # done on the second attempt
    assert h.health().internal_errors == 0


# -- ids that are not UTF-8 ----------------------------------------------------------------------


@pytest.mark.parametrize("ack", [True, False], ids=["leased", "at-most-once"])
def test_task_id_that_is_not_utf8_is_dead_lettered_and_poll_goes_on(
    ack: bool, client: redis.Redis, make_queue: Callable[..., DelayQueue]
) -> None:
    """Before: parsing the fetch reply raised UnicodeDecodeError for every poll, for ever."""
    q = make_queue("raw", ack=ack)
    plant_raw_id(client, q, envelope_of(client, q, {"planted": True}))
    good = q.offer({"ok": True})
    task = q.poll(timeout=5)
    assert task is not None and task.id == good
    task.ack()
    assert q.poll(timeout=0) is None

    (dead,) = q.dead()
    assert dead.id.encode("utf-8", "surrogateescape") == RAW_ID  # addressable by its bytes
    assert dead.payload == {"planted": True}
    assert dead.error is not None and "not UTF-8" in dead.error and "\\xff\\xfe" in dead.error
    assert client.zscore(q.keys.key("dead"), RAW_ID) is not None
    assert client.hget(q.keys.key("tasks"), RAW_ID) is not None  # its raw bytes kept
    stats = q.stats()
    assert stats.counters["decode_failures"] == 1
    assert (stats.delayed, stats.ready, stats.inflight, stats.dead) == (0, 0, 0, 1)


async def test_task_id_that_is_not_utf8_is_dead_lettered_by_the_async_queue(
    client: redis.Redis,
    make_queue: Callable[..., DelayQueue],
    make_async_queue: Callable[..., AsyncDelayQueue],
) -> None:
    q = make_async_queue("raw")
    plant_raw_id(client, q, envelope_of(client, make_queue("raw"), "x"))
    good = await q.offer("ok")
    task = await q.poll(timeout=5)
    assert task is not None and task.id == good
    await task.ack()
    (dead,) = await q.dead()
    assert dead.id.encode("utf-8", "surrogateescape") == RAW_ID


@pytest.mark.parametrize("kind", KINDS)
def test_worker_dead_letters_a_task_id_that_is_not_utf8_and_goes_on(
    kind: str,
    redis_server: EmbeddedRedis,
    client: redis.Redis,
    make_queue: Callable[..., DelayQueue],
    workers: Callable[..., Harness],
) -> None:
    """Before: ``Exception in thread delayq-worker-fetch``; nothing was fetched again."""
    q = make_queue("w")
    h = workers(kind, redis_server.url, lambda task: Step())
    plant_raw_id(client, q, envelope_of(client, q, "planted"))
    q.offer_many([(i, 0) for i in range(10)])
    wait_until(lambda: handled(h) >= set(range(10)) and q.stats().dead == 1, timeout=10)
    assert "planted" not in handled(h)
    health = h.health()
    assert health.alive and health.loop_restarts == 0 and health.internal_errors == 0


# -- the worker's own faults ---------------------------------------------------------------------


class FlakyMetrics(NoopMetrics):
    """A recorder whose ``heartbeat`` (called on each turn of the fetch loop) raises while
    ``failing`` is set, and whose ``handler_started`` raises for one task's first attempt."""

    def __init__(self, fail_times: int | None = None, bad_payload: Any = None) -> None:
        self.failing = threading.Event()
        self.fail_times = fail_times  # None: for as long as failing is set
        self.bad_payload = bad_payload
        self.internal: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def heartbeat(self, queue: str) -> None:
        if not self.failing.is_set():
            return
        with self._lock:
            if self.fail_times is not None:
                self.fail_times -= 1
                if self.fail_times <= 0:
                    self.failing.clear()
        raise RuntimeError("recorder broke")

    def internal_error(self, queue: str, where: str) -> None:
        self.internal.append((queue, where))


@pytest.mark.parametrize("kind", KINDS)
def test_fetch_loop_that_dies_is_restarted(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the fetch thread (or task) ended and the worker consumed nothing more."""
    caplog.set_level(logging.ERROR, logger="delayq.worker")
    recorder = FlakyMetrics(fail_times=2)
    h = workers(kind, redis7_server.url, lambda task: Step(), metrics=recorder)
    recorder.failing.set()
    wait_until(lambda: not recorder.failing.is_set(), timeout=5)
    q7.offer_many([(i, 0) for i in range(10)])
    wait_until(lambda: handled(h) >= set(range(10)), timeout=10)
    health = h.health()
    assert health.alive and health.loop_restarts == 2 and health.internal_errors == 2
    assert recorder.internal == [("w", "fetch loop")] * 2
    died = [r for r in caplog.records if "fetch loop of w died" in r.getMessage()]
    assert len(died) == 2 and "restarting it in" in died[0].getMessage()


@pytest.mark.parametrize("kind", KINDS)
def test_loop_that_keeps_dying_makes_health_false_and_run_fail(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    tmp_path: Path,
) -> None:
    recorder = FlakyMetrics()
    health_file = tmp_path / "health.json"
    h = workers(
        kind, redis7_server.url, lambda task: Step(), metrics=recorder, health_file=str(health_file)
    )
    recorder.failing.set()  # for good: the restarts cannot help
    assert h._thread is not None
    wait_until(lambda: not h._thread.is_alive(), timeout=15)  # run() returned by itself
    assert isinstance(h.error, WorkerFailed)
    assert "fetch loop of w died 5 times" in str(h.error) and "recorder broke" in str(h.error)
    health = h.health()
    assert not health.alive and health.state == "stopped"
    assert health.reason is not None and "fetch loop of w died 5 times" in health.reason
    doc = json.loads(health_file.read_text())
    assert doc["alive"] is False and "fetch loop of w died" in doc["reason"]
    h.error = None  # seen: the fixture's cleanup must not raise it again


@pytest.mark.parametrize("kind", KINDS)
def test_ack_loop_that_dies_is_restarted_and_nothing_is_lost(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker_class: Any = Worker if kind == "thread" else AsyncWorker
    original = worker_class._flush_acks
    broken = threading.Event()

    def fail_once(self: Any) -> Any:
        if not broken.is_set():
            broken.set()
            raise RuntimeError("ack machinery broke")
        return original(self)

    h = workers(kind, redis7_server.url, lambda task: Step())
    monkeypatch.setattr(worker_class, "_flush_acks", fail_once)
    q7.offer_many([(i, 0) for i in range(10)])
    wait_until(lambda: settled(q7), timeout=10)
    assert broken.is_set()
    assert sorted(c.payload for c in h.calls) == list(range(10))  # acked once, none again
    health = h.health()
    assert health.alive and health.loop_restarts == 1


@pytest.mark.parametrize("kind", KINDS)
def test_internal_error_on_a_task_is_logged_once_counted_and_the_task_retried(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault in the worker's own code while it handles one task (here: the metrics
    recorder's ``task_done``) costs that task an attempt, not a handler slot."""
    caplog.set_level(logging.ERROR, logger="delayq.worker")
    registry = CollectorRegistry()

    class BrokenOnce(WorkerMetrics):
        broke = False

        def task_done(self, queue: str, task: Any, outcome: str, duration_s: float) -> None:
            if task.payload == "unlucky" and not self.broke:
                self.broke = True
                raise RuntimeError("recorder broke on this task")
            super().task_done(queue, task, outcome, duration_s)

    metrics = BrokenOnce(registry)
    h = workers(kind, redis7_server.url, lambda task: Step(), concurrency=1, metrics=metrics)
    unlucky = q7.offer("unlucky")
    wait_until(lambda: h.attempts_of("unlucky") == [1], timeout=5)
    q7.offer_many([(i, 0) for i in range(5)])
    wait_until(lambda: handled(h) >= set(range(5)) and settled(q7), timeout=10)
    health = h.health()
    assert health.internal_errors == 1 and health.loop_restarts == 0 and health.alive
    # The ack was already on its way when the recorder broke: the task is not run again.
    assert h.attempts_of("unlucky") == [1]
    value = registry.get_sample_value(
        "delayq_worker_internal_errors_total", {"queue": "w", "where": "run"}
    )
    assert value == 1.0
    logged = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(logged) == 1 and unlucky in logged[0].getMessage()


@pytest.mark.parametrize("kind", KINDS)
def test_internal_error_before_the_verdict_retries_the_task(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
) -> None:
    """A fault before the verdict went to Redis: the task is retried at once with the fault as
    its last error, and dead-lettered like any task once its attempts run out."""
    recorder = FlakyMetrics()

    def start(queue: str) -> None:
        raise RuntimeError("handler_started broke")

    recorder.handler_started = start  # type: ignore[method-assign]
    workers(kind, redis7_server.url, lambda task: Step(), metrics=recorder, max_attempts=2)
    task_id = q7.offer("doomed")
    wait_until(lambda: q7.stats().dead == 1, timeout=10)
    (dead,) = q7.dead()
    assert dead.id == task_id and dead.attempts == 2
    assert dead.error is not None and "delayq worker internal error" in dead.error
    assert "handler_started broke" in dead.error
    assert recorder.internal == [("w", "run")] * 2


BROKEN_ACKS = """
from delayq._workers.async_worker import AsyncWorker
from delayq._workers.thread_worker import Worker


def _broken(self):
    raise RuntimeError("ack machinery broke")


Worker._flush_acks = _broken
AsyncWorker._flush_acks = _broken


def handle(task):
    pass


async def handle_async(task):
    pass
"""


@pytest.mark.parametrize("target", ["handle", "handle_async"], ids=KINDS)
def test_worker_command_exits_non_zero_when_a_loop_keeps_dying(
    target: str, redis7_server: EmbeddedRedis, prefix: str, tmp_path: Path
) -> None:
    """``delayq worker`` as a supervisor runs it: a worker that cannot keep its ack loop
    going stops by itself, says why on one line, and exits 1 (before: it ran on, unacked)."""
    (tmp_path / "broken_acks.py").write_text(BROKEN_ACKS)
    with DelayQueue("w", redis7_server.url, prefix=prefix) as q:
        q.offer("done, never acked")  # the asyncio ack loop turns only when a task is done
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env.pop("REDIS_URL", None)
    argv = [
        sys.executable, "-m", "delayq.cli", "worker", f"broken_acks:{target}", "-q", "w",
        "--redis", redis7_server.url, "--prefix", prefix,
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: delayq worker stopped: the ack loop died 5 times"), last
    assert "ack machinery broke" in last


# -- hostile text in log lines --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_log_lines_escape_ansi_bidi_and_surrogates_from_task_data(
    kind: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="delayq")
    hostile = "\x1b[31mred\x1b]8;;http://x\x07\u202egnp.exe\x9b\udcff"

    def behave(task: Any) -> Step:
        return Step(error=RuntimeError(hostile)) if task.payload == "hostile" else Step()

    workers(kind, redis7_server.url, behave, max_attempts=2)
    task_id = q7.offer("hostile", id="id\x1b[2J\u2066")
    wait_until(lambda: q7.stats().dead == 1, timeout=10)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("delayq")]
    mentions = [line for line in lines if "\\x1b[2J\\u2066" in line]
    assert len(mentions) >= 2  # the retry and the dead-letter lines name the task, escaped
    assert any("\\x1b[31mred" in line and "\\u202egnp.exe" in line for line in lines)
    assert any("\\udcff" in line and "\\x9b" in line for line in lines)
    for line in lines:
        assert not CONTROL.search(line), line
        line.encode("utf-8")  # no lone surrogates either
    (dead,) = q7.dead()
    assert dead.id == task_id  # the stored id is the caller's, unchanged


# -- the bar: one poisonous task among 1,000 healthy ones ----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_one_poisonous_task_among_1000_loses_none_and_stalls_nothing(
    kind: str, redis7_server: EmbeddedRedis, q7: DelayQueue, workers: Callable[..., Harness]
) -> None:
    """The timings against a run without the poison are bench/poison.py's."""
    q7.offer("poison")
    q7.offer_many([(i, 0) for i in range(1000)])
    h = workers(kind, redis7_server.url, poisoned("poison"), concurrency=8, max_attempts=3)
    wait_until(lambda: handled(h) >= set(range(1000)), timeout=30)
    wait_until(lambda: settled(q7) and q7.stats().dead == 1, timeout=10)
    healthy = [c.payload for c in h.calls if c.payload != "poison"]
    assert sorted(healthy) == list(range(1000))  # each once: none lost, none repeated
    assert h.attempts_of("poison") == [1, 2, 3]
    wait_until(lambda: (h.health().succeeded, h.health().dead) == (1000, 1), timeout=5)
    assert h.health().alive


# -- a failure that cannot be recorded --------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["lease taken", "scripts refused"])
def test_a_failure_that_cannot_be_recorded_is_logged_and_the_task_comes_back_by_its_lease(
    kind: str,
    fault: str,
    redis7_server: EmbeddedRedis,
    q7: DelayQueue,
    workers: Callable[..., Harness],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handler fails, and the worker cannot record the failure in Redis: the task's lease
    went to someone else (``LeaseLost``), or Redis refuses its scripts (an ACL change: a
    ``DelayqError``).
    The worker logs it, counts the run as failed (not retried, not dead), stays alive, and
    the task runs again once its lease runs out."""
    caplog.set_level(logging.WARNING, logger="delayq.worker")
    client = redis.Redis.from_url(redis7_server.url)
    registry = CollectorRegistry()

    def behave(task: Any) -> Step:
        if task.payload != "unlucky" or task.attempts > 1:
            return Step()
        if fault == "lease taken":
            client.hset(q7.keys.key("leases"), task.id, "another-consumer-token")
        else:
            client.execute_command("ACL", "SETUSER", "default", "-evalsha", "-eval")
        return Step(error=RuntimeError("handler failed"))

    try:
        h = workers(
            kind, redis7_server.url, behave, concurrency=1, metrics=WorkerMetrics(registry),
            queue_options={"visibility_timeout": 2.0, "reconnect_timeout": 1.0},
        )  # fmt: skip
        unlucky = q7.offer("unlucky")
        expected = (
            "lost before its failure was recorded"
            if fault == "lease taken"
            else "could not record failure"
        )
        wait_until(lambda: any(expected in r.getMessage() for r in caplog.records), timeout=15)
        client.execute_command("ACL", "SETUSER", "default", "+@all")
        wait_until(lambda: h.attempts_of("unlucky") == [1, 2] and settled(q7), timeout=20)
    finally:
        client.execute_command("ACL", "SETUSER", "default", "+@all")
        client.close()
    logged = [r.getMessage() for r in caplog.records if expected in r.getMessage()]
    assert len(logged) == 1 and unlucky in logged[0]
    health = h.health()
    assert health.alive and health.internal_errors == 0
    assert health.failed == 1 and health.dead == 0 and health.succeeded == 1

    def runs(outcome: str) -> float | None:
        return registry.get_sample_value(
            "delayq_worker_tasks_total", {"queue": "w", "outcome": outcome}
        )

    assert runs("failed") == 1.0 and runs("acked") == 1.0
    assert not runs("retried") and not runs("dead")  # absent, or made at 0
