"""The README's typed-payload example runs as written, in seconds (issue #22: it used to
block for 30 minutes), against the test's own server and key prefix."""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_typed_payload_example_runs_in_seconds(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    section = README.read_text().split("### Typed payloads", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n### ", 1)[0], re.S)
    queue = functools.partial(DelayQueue, redis=redis7_server.url, prefix=prefix)
    namespace = {"DelayQueue": queue}
    started = time.monotonic()
    exec(compile(code, "README.md (Typed payloads)", "exec"), namespace)
    elapsed = time.monotonic() - started
    assert 1.9 <= elapsed < 10, elapsed  # not early; seconds, not 30 minutes
    namespace["q"].close()
