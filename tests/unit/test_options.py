"""A queue's options, validated once (delayq._core.options): pure, no Redis."""

from __future__ import annotations

import inspect
import math
from datetime import timedelta
from typing import Any

import pytest

from delayq import AsyncDelayQueue, Backoff, ConfigError, DelayQueue, Durability
from delayq._core.models import DedupMode
from delayq._core.options import QueueOptions, dedup_mode, overridden_policy
from delayq._core.protocol import Policy
from delayq.outbox import QueueFormat


def test_defaults_are_the_queues() -> None:
    ours = inspect.signature(QueueOptions.of).parameters
    for cls in (AsyncDelayQueue, DelayQueue):
        theirs = inspect.signature(cls.__init__).parameters
        shared = set(ours) & set(theirs)
        assert shared == set(ours)  # every option of the queue's, none of its own
        assert {n: ours[n].default for n in shared} == {n: theirs[n].default for n in shared}
    fmt = inspect.signature(QueueFormat).parameters
    assert {n: fmt[n].default for n in fmt} == {n: ours[n].default for n in fmt}


def test_values_in_the_engines_units() -> None:
    options = QueueOptions.of()
    assert options.policy == Policy(30_000, 10, Backoff())
    assert (options.codec.codec, options.codec.payload_type, options.codec.max_bytes) == (
        "json",
        None,
        1 << 20,
    )
    assert options.dedup is DedupMode.KEEP
    assert (options.safety_s, options.reconnect_s, options.overdue_ms) == (10.0, None, 1000)
    assert (options.prefix, options.durability, options.fetch_ahead) == ("dq", None, 8)
    assert (options.shards, options.create) == (None, False)
    options = QueueOptions.of(
        visibility_timeout=timedelta(seconds=1.5),
        safety_interval=0.25,
        reconnect_timeout=0,
        overdue_after=timedelta(0),
        retry_backoff=Backoff(base=2),
        dedup="replace",
        shards=4,
        create=True,
        durability=Durability(),
    )
    assert options.policy == Policy(1500, 10, Backoff(base=2))
    assert (options.safety_s, options.reconnect_s, options.overdue_ms) == (0.25, 0.0, 0)
    assert (options.dedup, options.shards, options.create) == (DedupMode.REPLACE, 4, True)
    assert options.durability == Durability()


def test_at_most_once_has_no_lease() -> None:
    assert QueueOptions.of(ack=False).policy.lease_ms == 0
    with pytest.raises(ConfigError, match="visibility_timeout"):
        QueueOptions.of(ack=False, visibility_timeout=0)  # a mistake either way


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"codec": "xml"}, "codec"),
        ({"codec": "JSON"}, "codec"),
        ({"payload_type": "Order"}, "payload_type"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"visibility_timeout": -1}, "visibility_timeout"),
        ({"visibility_timeout": "30"}, "visibility_timeout"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"retry_backoff": 1.0}, "retry_backoff"),
        ({"ack": "yes"}, "ack"),
        ({"dedup": "sometimes"}, "dedup"),
        ({"dedup": DedupMode}, "dedup"),
        ({"safety_interval": 0}, "safety_interval"),
        ({"reconnect_timeout": "10"}, "reconnect_timeout"),
        ({"reconnect_timeout": -1}, "reconnect_timeout"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"max_payload_bytes": 1.0}, "max_payload_bytes"),
        ({"overdue_after": math.nan}, "overdue_after"),
        ({"prefix": "has space"}, "prefix"),
        ({"prefix": ""}, "prefix"),
        ({"durability": 1}, "durability"),
        ({"fetch_ahead": 101}, "fetch_ahead"),
        ({"fetch_ahead": -1}, "fetch_ahead"),
        ({"fetch_ahead": True}, "fetch_ahead"),
        ({"shards": 0}, "shards"),
        ({"shards": True}, "shards"),
        ({"create": 1}, "create"),
    ],
)
def test_a_bad_option_is_a_config_error_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        QueueOptions.of(**options)


def test_keys_check_the_name() -> None:
    options = QueueOptions.of(prefix="app")
    assert options.keys("orders").key("tasks") == "app:{orders}:tasks"
    assert options.keys("orders", sharded_channel=True).channel == "app:{orders}:sevents"
    for bad in ["", "a b", "{q}", "x" * 201]:
        with pytest.raises(ConfigError, match="queue name"):
            options.keys(bad)
    QueueOptions.of().keys("x" * 200)
    with pytest.raises(ConfigError, match="sharded queue's name"):
        QueueOptions.of(shards=2).keys("x" * 200)  # no room for its shards' suffixes


def test_overridden_policy() -> None:
    policy = Policy(30_000, 10, Backoff())
    assert overridden_policy(policy, "q") == policy
    assert overridden_policy(policy, "q", 2, 3, Backoff(base=5)) == Policy(2000, 3, Backoff(base=5))
    for bad, named in [
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_backoff": "fast"}, "retry_backoff"),
    ]:
        with pytest.raises(ConfigError, match=named):
            overridden_policy(policy, "q", **bad)
    with pytest.raises(ConfigError, match="at-most-once"):
        overridden_policy(Policy(0, 10, Backoff()), "q", visibility_timeout=5)
    assert overridden_policy(Policy(0, 10, Backoff()), "q", max_attempts=2).lease_ms == 0


def test_dedup_mode_names_the_parameter() -> None:
    assert dedup_mode("keep") is DedupMode.KEEP
    with pytest.raises(ConfigError, match="dedup must be 'keep' or 'replace', got 'never'"):
        dedup_mode("never")


def test_the_outbox_format_is_checked_as_a_queue_is() -> None:
    fmt = QueueFormat(codec="pickle", max_payload_bytes=64, dedup="replace")
    options = fmt.options("app")
    assert (options.codec.codec, options.codec.max_bytes) == ("pickle", 64)
    assert (options.dedup, options.prefix) == (DedupMode.REPLACE, "app")
    assert fmt.envelope_codec() == options.codec
    for bad, named in [
        (QueueFormat(codec="yaml"), "codec"),
        (QueueFormat(max_payload_bytes=0), "max_payload_bytes"),
        (QueueFormat(dedup="maybe"), "dedup"),
        (QueueFormat(payload_type="Order"), "payload_type"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(ConfigError, match=named):
            bad.options()
    with pytest.raises(ConfigError, match="prefix"):
        QueueFormat().options("has space")
