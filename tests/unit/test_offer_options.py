"""The offer options, declared once (``OfferOptions``) and taken as ``**options`` by every
offer: the queues', the outboxes' and Django's helpers'. A keyword no offer takes fails
as it did when each signature listed the options, naming the nearest option."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from delayq import AsyncDelayQueue, DelayQueue, Offer
from delayq._core.offers import OFFER_OPTIONS, check_dedup, check_options, offer_of
from delayq.outbox import AsyncOutbox, Outbox
from delayq.outbox._rows import Formats, offer_row


def test_the_options_are_offer_s_fields_and_dedup() -> None:
    fields = {f.name for f in dataclasses.fields(Offer)} - {"payload", "delay"}
    assert set(OFFER_OPTIONS) == fields | {"dedup"}


@pytest.mark.parametrize(
    "method", [DelayQueue.offer, AsyncDelayQueue.offer, Outbox.offer, AsyncOutbox.offer]
)
def test_every_offer_takes_the_options_once(method: object) -> None:
    params = list(inspect.signature(method).parameters.values())  # type: ignore[arg-type]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert params[-1].annotation == "Unpack[OfferOptions]"
    assert [p.name for p in params[-3:-1]] == ["payload", "delay"]


def test_an_unknown_option_is_a_type_error_naming_the_nearest() -> None:
    with pytest.raises(TypeError, match=r"^DelayQueue.offer\(\) got an unexpected keyword "
                       r"argument 'kye' \(did you mean 'key'\?\)$"):  # fmt: skip
        check_options({"key": "k", "kye": "k"}, "DelayQueue.offer")
    with pytest.raises(TypeError, match=r"argument 'zzz'$"):
        offer_of("p", 1, {"zzz": 1}, "offer")  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match=r"^Outbox.offer\(\) .* 'ttl_s' \(did you mean 'ttl'\?\)"):
        offer_row(Formats("dq", None), "q", "p", 1, {"ttl_s": 5})  # type: ignore[typeddict-unknown-key]


def test_options_become_an_offer() -> None:
    offer = offer_of("p", 5, {"key": "k", "priority": 2, "dedup": "replace"}, "offer")
    assert offer == Offer("p", 5, key="k", priority=2)
    assert offer_of("p", None, {}, "offer") == Offer("p")


def test_dedup_is_checked_as_the_queue_checks_it() -> None:
    assert check_dedup(None) is None
    assert check_dedup("replace") == "replace"
    with pytest.raises(ValueError, match="dedup must be 'keep' or 'replace', got 'drop'"):
        check_dedup("drop")
