"""OpenTelemetry tracing (the ``otel`` extra, on ``opentelemetry-api``; docs/tracing.md).

An offer made inside a span stores that span's W3C trace context (``traceparent``, and
``tracestate`` when set) in the task's headers, wherever the envelope is encoded: queues,
bulk offers, the outbox and Django alike. A worker runs each handler in a CONSUMER span,
``process <queue>``, linked to that context (the offer may have been 30 minutes and several
processes ago), with the messaging semantic-convention attributes; an exception the handler
raises is recorded on it and sets its status to ERROR. A worker's fetches that bring tasks
are ``receive <queue>`` spans and its ack batches ``settle <queue>`` spans, linked to the
tasks' offers.

Without ``opentelemetry-api`` every function here is a no-op. With it and no SDK configured,
nothing is injected (there is no valid span to propagate) and a handler's span is a
non-recording one: a few microseconds per task, no allocation per offer.
"""

from __future__ import annotations

import contextlib
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


def now_ns() -> int:
    """The start time to give :func:`record` (0 without the extra: nothing is recorded)."""
    return time.time_ns() if ENABLED else 0


def record(operation: str, queue: str, tasks: Sequence[Any], started_ns: int,
           error: BaseException | None = None) -> None:  # fmt: skip
    """A span of a worker's Redis call for ``tasks``, begun at ``started_ns``, ended now:
    ``receive`` (a fetch that brought them) or ``settle`` (their acks), linked to each
    task's offer. Idle fetches, which bring nothing, record nothing."""
    if not ENABLED or not tasks:
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
def consumer_span(queue: str, task: Any) -> Iterator[Any]:
    """The CONSUMER span of one handler run, linked to the context the offer stored; an
    exception leaving it is recorded and marks it ERROR (and propagates)."""
    if not ENABLED:
        yield None
        return
    offered = trace.get_current_span(_PROPAGATOR.extract(task.headers or {})).get_span_context()
    links = [Link(offered)] if offered.is_valid else None
    with _tracer().start_as_current_span(
        f"process {queue}", kind=SpanKind.CONSUMER, links=links,
        attributes=attributes(queue, task),
    ) as span:  # fmt: skip
        yield span
