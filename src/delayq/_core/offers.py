"""Turning what a user offers into a validated, encoded :class:`OfferSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .envelope import EnvelopeCodec
from .protocol import OfferSpec, check_headers, check_id, check_key, check_priority, new_task_id
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


def build_offer(codec: EnvelopeCodec, offer: Offer) -> OfferSpec:
    """Validate and encode an offer; raises an :class:`InvalidTaskError` and writes nothing."""
    kind, value = due_spec(offer.delay, offer.at)
    priority = check_priority(offer.priority)
    headers = check_headers(offer.headers)
    key = check_key(offer.key) if offer.key is not None else None
    envelope = codec.encode(offer.payload, headers=headers, priority=priority, key=key)
    return OfferSpec(
        id=check_id(offer.id) if offer.id is not None else new_task_id(),
        due_kind=kind,
        due_value=value,
        priority=priority,
        envelope=envelope,
        key=key or "",
        key_ttl_ms=duration_ms(offer.key_ttl, "key_ttl") if offer.key_ttl is not None else 0,
        ttl_ms=duration_ms(offer.ttl, "ttl", allow_zero=False) if offer.ttl is not None else 0,
    )
