"""OpenTelemetry tracing (the ``otel`` extra, on ``opentelemetry-api``; docs/tracing.md).

An offer made inside a span stores that span's W3C trace context (``traceparent``, and
``tracestate`` when set) in the task's headers, wherever the envelope is encoded: queues,
bulk offers, the outbox and Django alike. A worker runs each handler in a CONSUMER span,
``process <queue>``, linked to that context (the offer may have been 30 minutes and several
processes ago), with the messaging semantic-convention attributes; an exception the handler
raises is recorded on it and sets its status to ERROR. An offer made inside a span is a
PRODUCER span ``send <queue>`` (the context the tasks store); every fetch that brings tasks
(``take``, ``poll``, ``poll_many``, a worker's) is a ``receive <queue>`` span and every ack
(one or a batch) a ``settle <queue>`` span, linked to the tasks' offers.

Without ``opentelemetry-api`` every function here is a no-op. With it and no SDK configured,
nothing is injected (there is no valid span to propagate) and no span is made: one look at
the tracer provider per offer, fetch, ack and handler run.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

ENABLED: Final = trace is not None
SYSTEM: Final = "delayq"  # messaging.system
_PROPAGATOR: Any = TraceContextTextMapPropagator() if ENABLED else None
# An SDK named in the environment, which OpenTelemetry loads at the first provider lookup.
_PROVIDER_FROM_ENV: Final = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _tracer() -> Any:
    # Asked each time: an SDK configured after import (as applications do) takes effect.
    return trace.get_tracer("delayq")


def active() -> bool:
    """Whether the current context holds a valid span (whose context an offer would store)."""
    return ENABLED and trace.get_current_span().get_span_context().is_valid


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` plus the current span's W3C trace context; ``headers`` itself when there
    is none, or when the caller set ``traceparent`` (theirs wins)."""
    if not ENABLED or (headers and "traceparent" in headers):
        return headers
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier: dict[str, str] = dict(headers or {})
    _PROPAGATOR.inject(carrier)
    return carrier


def attributes(queue: str, task: Any) -> dict[str, Any]:
    """The semantic-convention messaging attributes of one delivery of ``task``."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": task.id,
        "messaging.delayq.delivery_attempt": task.attempts,
        "messaging.delayq.lateness_ms": task.lateness_ms,
    }


def configured() -> bool:
    """Whether an SDK's tracer provider is set: until one is, every span would be a
    non-recording one, and a fetch of many tasks need not extract each one's context.
    Asked once per handler run: while no provider is set, OpenTelemetry's lookup reads the
    environment each time (about 5 % of an asyncio worker's client CPU per task), so the global
    it sets is read first where the API keeps it."""
    if not _PROVIDER_FROM_ENV and getattr(trace, "_TRACER_PROVIDER", False) is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def now_ns() -> int:
    """The start time to give :func:`record` (0 without the extra: nothing is recorded)."""
    return time.time_ns() if ENABLED else 0


def record(operation: str, queue: str, tasks: Sequence[Any], started_ns: int,
           error: BaseException | None = None) -> None:  # fmt: skip
    """A span of a queue's Redis call for ``tasks``, begun at ``started_ns``, ended now:
    ``receive`` (a fetch that brought them) or ``settle`` (their acks), linked to each
    task's offer. Idle fetches, which bring nothing, record nothing."""
    if not ENABLED or not tasks or not configured():
        return
    links = []
    for task in tasks:
        offered = trace.get_current_span(_PROPAGATOR.extract(task.headers or {}))
        if offered.get_span_context().is_valid:
            links.append(Link(offered.get_span_context(), {"messaging.message.id": task.id}))
    kind = SpanKind.CONSUMER if operation == "receive" else SpanKind.CLIENT
    span = _tracer().start_span(
        f"{operation} {queue}", kind=kind, links=links, start_time=started_ns,
        attributes={"messaging.system": SYSTEM, "messaging.operation.type": operation,
                    "messaging.operation.name": "fetch" if operation == "receive" else "ack",
                    "messaging.destination.name": queue,
                    "messaging.batch.message_count": len(tasks)},
    )  # fmt: skip
    if error is not None:
        span.record_exception(error)
        span.set_status(StatusCode.ERROR, str(error))
    span.end()


@contextlib.contextmanager
def producer_span(queue: str, count: int) -> Iterator[Any]:
    """The PRODUCER span ``send <queue>`` of an offer made inside a span: current while the
    tasks are encoded, so each stores its context and the consumer's span links to it. An
    exception leaving it is recorded and marks it ERROR (and propagates)."""
    with _tracer().start_as_current_span(
        f"send {queue}", kind=SpanKind.PRODUCER,
        attributes={"messaging.system": SYSTEM, "messaging.operation.type": "send",
                    "messaging.operation.name": "offer", "messaging.destination.name": queue,
                    "messaging.batch.message_count": count},
    ) as span:  # fmt: skip
        yield span


def consumer_span(queue: str, task: Any) -> contextlib.AbstractContextManager[Any]:
    """The CONSUMER span of one handler run, linked to the context the offer stored; an
    exception leaving it is recorded and marks it ERROR (and propagates). A shared no-op
    while no SDK is configured: its span would record nothing and carry no valid context,
    and making it (the link's extraction, the attributes, the context switch) cost a worker
    a third of its client CPU per task."""
    if not ENABLED or not configured():
        return _NO_SPAN
    return _consumer_span(queue, task)


_NO_SPAN: Final = contextlib.nullcontext()


@contextlib.contextmanager
def _consumer_span(queue: str, task: Any) -> Iterator[Any]:
    offered = trace.get_current_span(_PROPAGATOR.extract(task.headers or {})).get_span_context()
    links = [Link(offered)] if offered.is_valid else None
    with _tracer().start_as_current_span(
        f"process {queue}", kind=SpanKind.CONSUMER, links=links,
        attributes=attributes(queue, task),
    ) as span:  # fmt: skip
        yield span
