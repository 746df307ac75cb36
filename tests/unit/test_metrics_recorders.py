"""delayq.metrics without Redis: optional dependency, no-op recorder, worker recorder maths,
and the histogram the collector builds from ``Stats``."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from delayq import AsyncWorker, Stats, Worker
from delayq.metrics import (
    BUCKETS_S,
    NOOP,
    OUTCOMES,
    MetricsUnavailable,
    NoopMetrics,
    QueueCollector,
    WorkerMetrics,
    WorkerRecorder,
)

WITHOUT_PROMETHEUS = """
import sys
sys.modules["prometheus_client"] = None  # as if not installed
import delayq, delayq.worker, delayq.metrics
from delayq.cli import app
assert "prometheus_client" not in [m for m, v in sys.modules.items() if v is not None]
q = delayq.DelayQueue("q", "redis://127.0.0.1:1/0")
delayq.Worker(q, print)  # no metrics asked for: the no-op recorder
try:
    delayq.metrics.WorkerMetrics
except delayq.metrics.MetricsUnavailable as exc:
    print(exc)
else:
    raise SystemExit("WorkerMetrics imported without prometheus_client")
"""


def test_delayq_imports_and_works_without_prometheus_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PROMETHEUS], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'delayq[metrics]'" in done.stdout


def test_import_delayq_does_not_load_prometheus_client() -> None:
    code = "import sys, delayq, delayq.worker; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "False", done.stderr


def test_unknown_name_is_an_attribute_error() -> None:
    import delayq.metrics

    with pytest.raises(AttributeError):
        delayq.metrics.NoSuchThing  # noqa: B018
    assert issubclass(MetricsUnavailable, ImportError)


def test_noop_recorder_has_the_recorder_interface() -> None:
    recorder: WorkerRecorder = NOOP
    assert isinstance(recorder, NoopMetrics)
    wanted = {n for n, _ in inspect.getmembers(WorkerRecorder) if not n.startswith("_")}
    for name in wanted:
        assert inspect.signature(getattr(NoopMetrics, name)) == inspect.signature(
            getattr(WorkerRecorder, name)
        )
        assert inspect.signature(getattr(WorkerMetrics, name)) == inspect.signature(
            getattr(WorkerRecorder, name)
        )
    for cls in (Worker, AsyncWorker):
        assert "metrics" in inspect.signature(cls).parameters


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_worker_metrics_measure_on_the_redis_clock() -> None:
    registry = CollectorRegistry()
    recorder = WorkerMetrics(registry)
    recorder.worker_started(["q"])
    assert sample(registry, "delayq_worker_up", queue="q") == 1
    for outcome in OUTCOMES:  # every series exists from the start, at 0
        assert sample(registry, "delayq_worker_tasks_total", queue="q", outcome=outcome) == 0
    # Redis's clock is an hour ahead of this host's: lateness and end-to-end must not see it.
    server_now_ms = int((time.time() + 3600) * 1000)
    task = SimpleNamespace(due_ms=server_now_ms - 7, delivered_ms=server_now_ms)
    recorder.delivered("q", [task])
    recorder.handler_started("q")
    assert sample(registry, "delayq_worker_in_progress", queue="q") == 1
    recorder.handler_ended("q")
    recorder.task_done("q", task, "retried", 0.004)
    assert sample(registry, "delayq_worker_lateness_seconds_sum", queue="q") == 0.007
    assert sample(registry, "delayq_worker_lateness_seconds_bucket", queue="q", le="0.005") == 0
    assert sample(registry, "delayq_worker_lateness_seconds_bucket", queue="q", le="0.01") == 1
    e2e = sample(registry, "delayq_worker_end_to_end_seconds_sum", queue="q")
    assert e2e is not None and 0.006 <= e2e < 1.0
    assert sample(registry, "delayq_worker_tasks_total", queue="q", outcome="retried") == 1
    assert (
        sample(registry, "delayq_worker_handler_duration_seconds_sum", queue="q", outcome="retried")
        == 0.004
    )
    assert sample(registry, "delayq_worker_in_progress", queue="q") == 0
    before = time.time()
    recorder.heartbeat("q")
    beat = sample(registry, "delayq_worker_last_heartbeat_timestamp_seconds", queue="q")
    assert beat is not None and beat >= before
    recorder.worker_stopped(["q"])
    assert sample(registry, "delayq_worker_up", queue="q") == 0


def test_buckets_resolve_milliseconds_up_to_a_minute() -> None:
    assert BUCKETS_S[:3] == (0.001, 0.002, 0.005) and BUCKETS_S[-1] == 60
    assert list(BUCKETS_S) == sorted(BUCKETS_S)


def fixed_collector(monkeypatch: pytest.MonkeyPatch) -> QueueCollector:
    seen = datetime(2030, 1, 1, tzinfo=UTC)
    rows = [
        Stats(
            queue="q", delayed=3, ready=1, inflight=2, dead=1, overdue=1,
            oldest_overdue_age=2.5, next_due_at=None, counters={"offered": 7, "acked": 2},
            lateness={0.001: 2, 0.01: 3, 1.0: 0, math.inf: 1}, lateness_sum=9.5,
            consumer_seen_at=seen,
        ),
        Stats(
            queue="other.q:1", delayed=0, ready=0, inflight=0, dead=0, overdue=0,
            oldest_overdue_age=0.0, next_due_at=seen, consumer_seen_at=None,
        ),
    ]  # fmt: skip
    collector = QueueCollector("redis://127.0.0.1:1/0")  # never connected: snapshot is fixed
    monkeypatch.setattr(collector, "snapshot", lambda: (rows, True, 0.002))
    return collector


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_lateness_histogram_is_cumulative_with_sum_and_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = samples_of(fixed_collector(monkeypatch).render())

    def bucket(le: str) -> float:
        return got[
            ("delayq_delivery_lateness_seconds_bucket", frozenset({("queue", "q"), ("le", le)}))
        ]

    assert [bucket(le) for le in ("0.001", "0.01", "1.0", "+Inf")] == [2, 5, 5, 6]
    assert got[("delayq_delivery_lateness_seconds_count", frozenset({("queue", "q")}))] == 6
    assert got[("delayq_delivery_lateness_seconds_sum", frozenset({("queue", "q")}))] == 9.5
    other = frozenset({("queue", "other.q:1")})
    assert got[("delayq_delivery_lateness_seconds_count", other)] == 0
    assert ("delayq_next_due_timestamp_seconds", frozenset({("queue", "q")})) not in got
    assert ("delayq_consumer_last_seen_timestamp_seconds", other) not in got
    assert got[("delayq_offered_total", frozenset({("queue", "q")}))] == 7
    assert got[("delayq_purged_total", frozenset({("queue", "q")}))] == 0


def test_direct_text_equals_prometheus_client_exposition(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = fixed_collector(monkeypatch)
    registry = CollectorRegistry()
    registry.register(collector)
    exposed = generate_latest(registry).decode()
    written = collector.render()
    assert samples_of(written) == samples_of(exposed)
    kinds = {f.name: f.type for f in text_string_to_metric_families(written)}
    assert kinds == {f.name: f.type for f in text_string_to_metric_families(exposed)}
    assert kinds["delayq_delivery_lateness_seconds"] == "histogram"
    assert kinds["delayq_offered"] == "counter"
