"""tracing.configured(): no SDK until one is set in code or named in the environment. Each
case runs in a fresh interpreter (OpenTelemetry sets a provider once per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from delayq._core import tracing
before = tracing.configured()
if "set" in __import__("sys").argv:
    trace.set_tracer_provider(TracerProvider())
print(before, tracing.configured())
"""


@pytest.mark.parametrize(
    ("how", "env", "expected"),
    [
        ("none", {}, "False False"),
        ("set", {}, "False True"),
        ("none", {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}, "True True"),
    ],
)
def test_configured_sees_a_provider_set_in_code_or_named_in_the_environment(
    how: str, env: dict[str, str], expected: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, how], env={**environ, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected.split()
