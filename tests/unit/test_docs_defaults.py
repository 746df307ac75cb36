"""The docs against the code: every default the README and the docs site state (timeouts,
intervals, limits) is the one in the signatures, and every public name has an API reference
entry. A changed default fails here until the sentence that states it is changed too."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import delayq
from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, Worker

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
UNITS = {"": 1, "s": 1, "ms": 0.001, "MiB": 1 << 20, "KiB": 1 << 10}


def _defaults(func: Any) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty and p.default is not None
    }


def code_defaults() -> dict[str, Any]:
    """Each option's default in the code; ``retry_backoff=None`` means ``Backoff()``."""
    defaults = {**_defaults(Worker.__init__), **_defaults(DelayQueue.__init__)}
    defaults["retry_backoff"] = Backoff()
    if "reconnect_timeout" not in defaults:  # None: chosen per topology; docs say a server's
        defaults["reconnect_timeout"] = reconnect_defaults()["standalone"]
    return defaults


def reconnect_defaults() -> dict[str, float]:
    """reconnect_timeout's default per topology, where the code has one table of them."""
    try:
        from delayq._core.connection import DEFAULT_RECONNECT_S
    except ImportError:
        return {"standalone": _defaults(DelayQueue.__init__)["reconnect_timeout"]}
    return {str(topology): seconds for topology, seconds in DEFAULT_RECONNECT_S.items()}


def texts() -> dict[str, str]:
    """README and every page of the docs site, each with its line breaks collapsed."""
    files = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return {str(f.relative_to(ROOT)): " ".join(f.read_text().split()) for f in files}


# `visibility_timeout` (30 s by default) / `overdue_after`, 1 s by default /
# `max_attempts` deliveries (10 by default)
STATED = re.compile(
    r"`(?P<name>\w+)`[^`.;:]{0,40}?(?P<value>\d[\d,.]*)\s*(?P<unit>s|ms|MiB|KiB)?\s+by default"
)
# `retry_backoff`: `Backoff(base=1, max=300, jitter=0.5)` by default
STATED_BACKOFF = re.compile(r"`(?P<name>\w+)`:?\s*`(?P<value>Backoff\([^`]*\))`\s+by default")
# The README's option list: `visibility_timeout=30`, `max_payload_bytes=1 MiB`, `prefix="dq"`
LISTED = re.compile(r"`(?P<name>\w+)=(?P<value>[^`]+)`")


def parse(value: str, unit: str = "") -> Any:
    value = value.strip().rstrip(",.")
    if value.startswith("Backoff("):
        return eval(value, {"Backoff": Backoff})  # a literal from our own docs
    if value in ("True", "False"):
        return value == "True"
    if value[0] in "\"'":
        return value.strip("\"'")
    number, _, listed_unit = value.partition(" ")
    return float(number.replace(",", "")) * UNITS[unit or listed_unit]


def stated_defaults() -> list[tuple[str, str, Any]]:
    """(file, option, value) for every default the docs state about an option of ours."""
    options = code_defaults()
    found = []
    for name, text in texts().items():
        for match in STATED.finditer(text):
            if match["name"] in options:
                found.append((name, match["name"], parse(match["value"], match["unit"] or "")))
        for match in STATED_BACKOFF.finditer(text):
            found.append((name, match["name"], parse(match["value"])))
    readme = texts()["README.md"]
    for heading in ("Options of `DelayQueue(name, redis, …)`:", "Options of both workers:"):
        paragraph = readme.split(heading, 1)[1].split("### ", 1)[0].split(" Measured", 1)[0]
        for match in LISTED.finditer(paragraph):
            if match["name"] in options:
                found.append(("README.md", match["name"], parse(match["value"])))
    return found


def test_the_docs_state_the_main_defaults() -> None:
    # Guards the patterns: if a rewording hid these from the check, it would pass vacuously.
    stated = {option for _, option, _ in stated_defaults()}
    assert {
        "visibility_timeout", "max_attempts", "retry_backoff", "safety_interval",
        "reconnect_timeout", "max_payload_bytes", "overdue_after", "prefix", "ack", "dedup",
    } <= stated  # fmt: skip


@pytest.mark.parametrize(("source", "option", "value"), stated_defaults())
def test_stated_default_is_the_code_default(source: str, option: str, value: Any) -> None:
    assert code_defaults()[option] == value, f"{source} says {option} defaults to {value!r}"


def test_sync_and_async_classes_share_their_defaults() -> None:
    assert _defaults(DelayQueue.__init__) == _defaults(AsyncDelayQueue.__init__)
    assert _defaults(Worker.__init__) == _defaults(AsyncWorker.__init__)


def test_readme_bounds_sleeps_by_the_safety_interval_default() -> None:
    # The first bullets once promised every sleep bounded at "1 s by default" (it is 10 s).
    intro = texts()["README.md"].split("## ", 1)[0]
    assert "1 s by default" not in intro
    assert f"`safety_interval` ({code_defaults()['safety_interval']:g} s by default)" in intro


def test_idle_consumer_cost_is_stated_the_same_everywhere() -> None:
    cost = "one script call per interval, about one Redis command a second"
    readme = texts()["README.md"]
    assert readme.count(cost) == 2, "the bullet and the option list both say it"
    assert cost in texts()["docs/concepts.md"]
    assert "one script call per interval" in (DelayQueue.__init__.__doc__ or DelayQueue.__doc__)


def test_reconnect_timeout_per_topology_is_stated_as_in_the_code() -> None:
    per_topology = reconnect_defaults()
    if len(per_topology) == 1:
        pytest.skip("one reconnect_timeout default for every topology")
    text = texts()["docs/guarantees.md"]
    assert f"{per_topology['sentinel']:g} s through Sentinel" in text
    assert f"{per_topology['cluster']:g} s on a cluster" in text


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = " ".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: delayq\.(\w+)$", reference, re.MULTILINE))
    missing = sorted(set(delayq.__all__) - documented)
    assert not missing, f"public names without an API reference entry: {missing}"
