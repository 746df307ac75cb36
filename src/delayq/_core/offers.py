"""Turning what a user offers into a validated, encoded :class:`OfferSpec`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .envelope import EnvelopeCodec
from .protocol import (
    OfferSpec,
    check_headers,
    check_id,
    check_key,
    check_priority,
    new_task_id,
    offer_options,
)
from .timing import Duration, due_spec, duration_ms


@dataclass(frozen=True, slots=True)
class Offer:
    """One task for :meth:`DelayQueue.offer_many`, with the same options as ``offer``."""

    payload: Any
    delay: Duration | None = None
    at: datetime | float | None = None
    key: str | None = None
    id: str | None = None
    priority: int = 0
    headers: dict[str, str] | None = None
    ttl: Duration | None = None
    key_ttl: Duration | None = None


def build_offer(codec: EnvelopeCodec, offer: Offer, new_id: str | None = None) -> OfferSpec:
    """Validate and encode an offer; raises an :class:`InvalidTaskError` and writes nothing."""
    kind, value = due_spec(offer.delay, offer.at)
    priority = check_priority(offer.priority)
    headers = check_headers(offer.headers)
    key = check_key(offer.key) if offer.key is not None else None
    key_ttl_ms = duration_ms(offer.key_ttl, "key_ttl") if offer.key_ttl is not None else 0
    ttl_ms = duration_ms(offer.ttl, "ttl", allow_zero=False) if offer.ttl is not None else 0
    return OfferSpec(
        check_id(offer.id) if offer.id is not None else new_id or new_task_id(),
        f"{kind}{value}",
        codec.encode(offer.payload, headers=headers, priority=priority, key=key),
        offer_options(priority, key, key_ttl_ms, ttl_ms),
    )


def build_plain_offer(
    codec: EnvelopeCodec, payload: Any, delay: Any, new_id: str | None = None
) -> OfferSpec:
    """The common bulk case, ``(payload, delay)``: no key, id, priority, headers or ttl."""
    return OfferSpec(
        new_id or new_task_id(),
        f"d{duration_ms(0 if delay is None else delay)}",
        codec.encode(payload),
    )


def build_plain_offers(
    codec: EnvelopeCodec, items: Sequence[tuple[Any, Any]], ids: Sequence[str]
) -> list[OfferSpec]:
    """:func:`build_plain_offer` for a whole bulk call of ``(payload, delay)`` pairs."""
    encode = codec.plain_encoder()
    return [
        OfferSpec(task_id, f"d{duration_ms(0 if delay is None else delay)}", encode(payload))
        for (payload, delay), task_id in zip(items, ids, strict=True)
    ]
