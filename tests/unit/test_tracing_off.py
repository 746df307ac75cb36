"""Without the otel extra (opentelemetry-api not importable) tracing is off and costs
nothing: envelopes stay bare, a handler's span is a no-op context (issue #22)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
import types
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from delayq._core import tracing
from delayq._core.envelope import EnvelopeCodec

assert tracing.ENABLED is False and tracing.active() is False
codec = EnvelopeCodec()
assert codec.encode({"a": 1}) == b'={"a":1}'
assert codec.plain_encoder() == codec._bare
assert tracing.with_trace_context({"k": "v"}) == {"k": "v"}
task = types.SimpleNamespace(id="t", headers={}, attempts=1, lateness_ms=0)
with tracing.consumer_span("q", task) as span:
    assert span is None
tracing.record("receive", "q", [task], tracing.now_ns())
print("off")
"""


def test_tracing_is_a_no_op_without_opentelemetry() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "off", done


def test_no_span_no_context_with_the_api_and_no_sdk() -> None:
    program = PROGRAM.replace('sys.modules["opentelemetry"] = None', "import opentelemetry")
    program = program.replace("tracing.ENABLED is False and ", "tracing.ENABLED and ")
    program = program.replace("assert codec.plain_encoder() == codec._bare\n", "")
    # No SDK: no span at all (it would record nothing), as without the API.
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "off", done
