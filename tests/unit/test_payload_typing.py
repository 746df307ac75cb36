"""Type checkers see a typed queue's payloads as the declared class: mypy on a sample file.

No Redis: mypy only reads the sample, nothing runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SAMPLE = """
from dataclasses import dataclass
from datetime import datetime

from delayq import AsyncDelayQueue, DelayQueue


@dataclass
class Order:
    order_id: int
    placed: datetime


def sync_side() -> None:
    typed = DelayQueue("orders", payload_type=Order)
    task = typed.take()
    reveal_type(task.payload)  # R1
    polled = typed.poll(timeout=1)
    assert polled is not None
    reveal_type(polled.payload)  # R2
    reveal_type(typed.poll_many(10)[0].payload)  # R3
    task_id = typed.offer(Order(1, datetime.now()), 60)
    reveal_type(task_id.outcome)  # R4
    typed.offer({"order_id": 1}, 60)  # E1: not an Order
    with DelayQueue("orders", payload_type=Order) as entered:
        reveal_type(entered.take().payload)  # R5
    untyped = DelayQueue("anything")
    reveal_type(untyped.take().payload)  # R6
    untyped.offer({"order_id": 1}, 60)  # any payload is fine


async def async_side() -> None:
    typed = AsyncDelayQueue("orders", payload_type=Order)
    task = await typed.take()
    reveal_type(task.payload)  # R7
    reveal_type((await typed.poll_many(10))[0].payload)  # R8
    reveal_type((await AsyncDelayQueue("anything").take()).payload)  # R9
"""

EXPECTED = {
    "R1": "sample.Order",
    "R2": "sample.Order",
    "R3": "sample.Order",
    "R4": "delayq._core.offers.OfferOutcome",
    "R5": "sample.Order",
    "R6": "Any",
    "R7": "sample.Order",
    "R8": "sample.Order",
    "R9": "Any",
}


def test_task_payload_has_the_declared_type(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--show-error-codes",
         "--cache-dir", str(tmp_path / "cache"), str(sample)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    lines = SAMPLE.splitlines()
    revealed: dict[str, str] = {}
    errors: dict[str, str] = {}
    for line in done.stdout.splitlines():
        found = re.match(r".*sample\.py:(\d+): (note|error): (.*)", line)
        if not found:
            continue
        source = lines[int(found.group(1)) - 1]
        marker = re.search(r"# ([RE]\d+)", source)
        assert marker, f"unexpected mypy output: {line}\n{done.stdout}"
        if found.group(2) == "note":
            revealed[marker.group(1)] = found.group(3).removeprefix("Revealed type is ").strip('"')
        else:
            errors[marker.group(1)] = found.group(3)
    assert revealed == EXPECTED, done.stdout
    assert list(errors) == ["E1"] and "Order" in errors["E1"], done.stdout
