"""OpenTelemetry traces from an offer to its handler (issue #22), with the SDK: the offer's
W3C trace context travels in the task's headers (a queue, a bulk offer, the outbox through
a relay process), and a worker runs each handler in a CONSUMER span linked to it, with the
messaging attributes, and a failing handler's error recorded. Across processes with the
in-memory exporter, and end to end through the OTLP/HTTP exporter into a receiver run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from delayq import DelayQueue, Offer, Worker
from delayq.embedded import EmbeddedRedis
from delayq.outbox import Outbox
from tests.helpers import wait_until
from tests.outbox_support import relay_process

pytest_plugins = ["tests.outbox_support"]
ROOT = Path(__file__).resolve().parents[2]
EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def sdk() -> Iterator[None]:
    """This process's SDK (set once per process: OpenTelemetry refuses a second one)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    yield


@pytest.fixture(autouse=True)
def fresh_spans() -> None:
    EXPORTER.clear()


def consumer_spans(name: str) -> list[Any]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def run_worker(q: DelayQueue, done: int, fail: frozenset[Any] = frozenset()) -> None:
    """Handle tasks until ``done`` handlers ended; a payload in ``fail`` raises."""
    ended = threading.Semaphore(0)

    def handle(task: Any) -> None:
        try:
            if task.payload in fail:
                raise RuntimeError(f"cannot close order {task.payload}")
        finally:
            ended.release()

    worker = Worker(q, handle, concurrency=2)
    handle_bg = worker.start_background()
    try:
        for _ in range(done):
            assert ended.acquire(timeout=20)
        wait_until(lambda: len(consumer_spans(f"process {q.name}")) >= done, timeout=10)
    finally:
        handle_bg.stop(timeout=10)


def test_a_handler_span_is_linked_to_the_offer_and_records_errors(
    make_queue: Any,
) -> None:
    q = make_queue("orders", max_attempts=1)
    tracer = trace.get_tracer("shop")
    with tracer.start_as_current_span("POST /orders") as request:
        ok_id = q.offer(42)
        bad_id = q.offer(13)
        bulk_ids = q.offer_many([Offer(7, 0), Offer(8, 0)])
    untraced = q.offer(99)  # no span around it: no context, no link
    plain = q.get(untraced)
    assert plain is not None and plain.headers == {}
    stored = q.get(ok_id)
    assert stored is not None and stored.headers["traceparent"].split("-")[1] == format(
        request.get_span_context().trace_id, "032x"
    )
    run_worker(q, 5, fail=frozenset({13}))

    # Each offer inside the request's span is a PRODUCER span under it, the context its
    # tasks keep; an offer outside any span starts none.
    sends = consumer_spans("send orders")
    assert [s.attributes["messaging.batch.message_count"] for s in sends] == [1, 1, 2]
    assert all(s.kind is SpanKind.PRODUCER for s in sends)
    assert all(s.parent.span_id == request.get_span_context().span_id for s in sends)
    send_of = dict(zip((ok_id, bad_id), sends[:2], strict=True))
    send_of.update(dict.fromkeys(bulk_ids, sends[2]))

    spans = {s.attributes["messaging.message.id"]: s for s in consumer_spans("process orders")}
    assert set(spans) == {ok_id, bad_id, *bulk_ids, untraced}
    for task_id in (ok_id, bad_id, *bulk_ids):
        span = spans[task_id]
        assert span.kind is SpanKind.CONSUMER
        (link,) = span.links
        assert link.context.trace_id == request.get_span_context().trace_id
        assert link.context.span_id == send_of[task_id].context.span_id
    ok = spans[ok_id]
    assert ok.status.status_code is StatusCode.UNSET
    assert ok.attributes["messaging.system"] == "delayq"
    assert ok.attributes["messaging.destination.name"] == "orders"
    assert ok.attributes["messaging.operation.type"] == "process"
    assert ok.attributes["messaging.delayq.delivery_attempt"] == 1
    assert ok.attributes["messaging.delayq.lateness_ms"] >= 0
    bad = spans[bad_id]
    assert bad.status.status_code is StatusCode.ERROR
    (event,) = [e for e in bad.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "RuntimeError"
    assert "cannot close order 13" in event.attributes["exception.message"]
    assert spans[untraced].links == ()

    # The worker's fetches that brought them and its ack batches, linked to their offers.
    def linked(name: str) -> set[str]:
        found = consumer_spans(name)
        assert all(s.attributes["messaging.destination.name"] == "orders" for s in found)
        return {link.attributes["messaging.message.id"] for s in found for link in s.links}

    assert linked("receive orders") == {ok_id, bad_id, *bulk_ids}
    assert all(s.kind is SpanKind.CONSUMER for s in consumer_spans("receive orders"))
    assert linked("settle orders") == {ok_id, *bulk_ids}  # 13 was dead-lettered, not acked


PRODUCER = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from delayq import DelayQueue
from delayq.outbox import Outbox
import psycopg

trace.set_tracer_provider(TracerProvider())
url, prefix, dsn, table = sys.argv[1:5]
with trace.get_tracer("shop").start_as_current_span("POST /orders") as span:
    q = DelayQueue("orders", url, prefix=prefix)
    direct = q.offer({"via": "queue"})
    q.close()
    box = Outbox(dsn, table=table, prefix=prefix)
    with psycopg.connect(dsn) as conn, conn.transaction():
        relayed = box.offer(conn, "orders", {"via": "outbox"}, 0)
ctx = span.get_span_context()
print(json.dumps({"trace_id": ctx.trace_id, "span_id": ctx.span_id,
                  "direct": direct, "relayed": relayed}))
"""


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_an_asyncio_worker_runs_each_handler_in_its_span(
    make_queue: Any, redis_url: str, prefix: str, timeout: Any
) -> None:
    """The asyncio worker, with and without a handler timeout: each handler runs inside its
    CONSUMER span (the current span while it runs), linked to its offer; one that raises
    marks its span ERROR."""
    import asyncio

    from delayq import AsyncDelayQueue, AsyncWorker

    q = make_queue("async-traced", max_attempts=1)
    with trace.get_tracer("shop").start_as_current_span("POST /orders"):
        ids = q.offer_many([Offer(1, 0), Offer(2, 0), Offer(3, 0)])
    inside: dict[Any, Any] = {}

    async def main() -> None:
        async with AsyncDelayQueue(q.name, redis_url, prefix=prefix) as aq:
            ended = asyncio.Event()

            async def handle(task: Any) -> None:
                inside[task.id] = trace.get_current_span().get_span_context().span_id
                if len(inside) == 3:
                    ended.set()
                if task.payload == 3:
                    raise RuntimeError("cannot close order 3")

            worker = AsyncWorker(aq, handle, timeout=timeout, handle_signals=False)
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(ended.wait(), 20)
            worker.stop()
            await running

    asyncio.run(main())
    spans = {
        s.attributes["messaging.message.id"]: s for s in consumer_spans("process async-traced")
    }
    assert set(spans) == set(ids)
    for task_id, span in spans.items():
        assert span.kind is SpanKind.CONSUMER and span.links
        assert inside[task_id] == span.context.span_id  # the handler ran inside it
    assert spans[ids[2]].status.status_code is StatusCode.ERROR
    assert {spans[i].status.status_code for i in ids[:2]} == {StatusCode.UNSET}


LATE_PROVIDER = textwrap.dedent(
    """
    import sys, threading
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from delayq import DelayQueue, Worker

    url, prefix = sys.argv[1:3]
    ran = {}
    ended = threading.Semaphore(0)

    def handle(task):
        ran[task.payload] = trace.get_current_span().get_span_context().is_valid
        ended.release()

    with DelayQueue("late-sdk", url, prefix=prefix) as q:
        background = Worker(q, handle).start_background()
        q.offer("before", 0)
        assert ended.acquire(timeout=20)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        q.offer("after", 0)
        assert ended.acquire(timeout=20)
        background.stop(timeout=10)
    names = [s.name for s in exporter.get_finished_spans()]
    print(ran["before"], ran["after"], names.count("process late-sdk"))
    """
)


def test_a_tracer_provider_set_while_the_worker_runs_applies_to_the_next_fetch(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    """The worker looks for an SDK once per fetch, not per task: a task fetched before the
    provider was set runs without a span, the next one fetched runs in its span."""
    out = subprocess.run(
        [sys.executable, "-c", LATE_PROVIDER, redis_server.url, prefix],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["False", "True", "1"]


def test_across_processes_the_queue_and_the_outbox_carry_the_context(
    redis_server: EmbeddedRedis, prefix: str, pg_dsn: str, table: str, outbox: Outbox,
    make_queue: Any,
) -> None:  # fmt: skip
    produced = subprocess.run(
        [sys.executable, "-c", PRODUCER, redis_server.url, prefix, pg_dsn, table],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    sent = json.loads(produced.stdout)
    q = make_queue("orders")
    with relay_process(pg_dsn, redis_server.url, table, name="trace-relay"):
        wait_until(lambda: q.get(sent["relayed"]) is not None, timeout=20)
    run_worker(q, 2)
    spans = {s.attributes["messaging.message.id"]: s for s in consumer_spans("process orders")}
    for task_id in (sent["direct"], sent["relayed"]):
        (link,) = spans[task_id].links
        assert link.context.trace_id == sent["trace_id"]
    # The outbox row keeps the request's own span; the direct offer its PRODUCER span, a
    # child of the request (checked span by span in the test above).
    assert spans[sent["relayed"]].links[0].context.span_id == sent["span_id"]
    assert spans[sent["direct"]].links[0].context.span_id != sent["span_id"]


class Receiver:
    """An OTLP/HTTP trace receiver: the spans of every POST /v1/traces, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for it
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        receiver.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


WORKER = """
import sys, threading
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from delayq import DelayQueue, Worker

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[3])))
trace.set_tracer_provider(provider)
done = threading.Event()
def handle(task):
    done.set()
    if task.payload == "fail":
        raise ValueError("refused")
q = DelayQueue("otlp", sys.argv[1], prefix=sys.argv[2], max_attempts=1)
handle_bg = Worker(q, handle).start_background()
assert done.wait(20)
handle_bg.stop(timeout=10)
provider.shutdown()  # flushes the batch to the receiver
"""


def test_end_to_end_through_the_otlp_http_exporter(
    redis_server: EmbeddedRedis, prefix: str, make_queue: Any
) -> None:
    receiver = Receiver()
    try:
        q = make_queue("otlp", max_attempts=1)
        with trace.get_tracer("shop").start_as_current_span("POST /pay") as request:
            task_id = q.offer("fail")
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(WORKER), redis_server.url, prefix,
             receiver.endpoint], cwd=ROOT, timeout=60, check=True,
        )  # fmt: skip
    finally:
        receiver.close()
    (span,) = [s for s in receiver.spans if s.name == "process otlp"]
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["messaging.message.id"].string_value == task_id
    assert attributes["messaging.system"].string_value == "delayq"
    assert span.kind == span.SPAN_KIND_CONSUMER
    (link,) = span.links
    assert link.trace_id == request.get_span_context().trace_id.to_bytes(16, "big")
    (send,) = [
        s for s in consumer_spans("send otlp") if s.parent.span_id == request.context.span_id
    ]
    assert link.span_id == send.context.span_id.to_bytes(8, "big")  # the offer's PRODUCER span
    assert span.status.code == span.status.STATUS_CODE_ERROR
    assert any(e.name == "exception" for e in span.events)
