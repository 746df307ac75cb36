"""Turning what a user offers into a validated, encoded :class:`OfferSpec`, and the offer
script's statuses into what happened (:class:`TaskId`, :class:`OfferOutcome`)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, Final, TypedDict

from ..exceptions import TaskIdConflict
from .envelope import EnvelopeCodec
from .limits import offered_limit_key
from .models import DedupMode
from .options import dedup_mode
from .protocol import (
    OfferSpec,
    check_headers,
    check_id,
    check_key,
    check_priority,
    new_task_id,
    offer_options,
    parse_offer,
)
from .timing import Duration, due_spec, duration_ms


class OfferOutcome(StrEnum):
    """What an offer did."""

    CREATED = "created"  # a new task was written
    EXISTING = "existing"  # a live task matched (same dedup key, or same id and content): kept
    REPLACED = "replaced"  # dedup="replace": the pending task holding the key was updated
    CONFLICT = "conflict"  # a task with other content holds the caller's id: kept, nothing written


class TaskId(str):
    """A task id, as ``offer`` returns it: a ``str`` that also says what the offer did.

    It compares, hashes and serialises as the plain id. ``outcome`` is an
    :class:`OfferOutcome`; ``created`` is True when this offer wrote a new task. After a dedup
    hit (``existing`` or ``replaced``) the id is the task that holds the key, not a new one.
    """

    # A created id is a bare TaskId, its outcome the class's: bulk offers make one per task
    # with str.__new__ alone, and read it back without an instance lookup (a per-id Python
    # __new__ and attribute would cost offer_many ~25% more client CPU).
    __slots__ = ()
    outcome: OfferOutcome = OfferOutcome.CREATED

    def __new__(cls, value: str, outcome: OfferOutcome = OfferOutcome.CREATED) -> TaskId:
        if outcome is OfferOutcome.CREATED:
            return str.__new__(TaskId, value)
        self = str.__new__(_FoundTaskId, value)
        self.outcome = outcome
        return self

    @property
    def created(self) -> bool:
        """True if this offer wrote a new task."""
        return self.outcome is OfferOutcome.CREATED

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskId, (str(self), self.outcome))

    def __repr__(self) -> str:
        return f"TaskId({str(self)!r}, outcome={self.outcome.value!r})"


class _FoundTaskId(TaskId):
    """A :class:`TaskId` whose offer did not create it: existing, replaced or conflict."""

    __slots__ = ("outcome",)  # shadows the base's class-level default


# The offer scripts' statuses (offer.lua's header) for an offer whose id the caller chose.
_OUTCOMES: Final = {
    0: OfferOutcome.EXISTING,
    1: OfferOutcome.CREATED,
    2: OfferOutcome.REPLACED,
    3: OfferOutcome.CONFLICT,
}


def task_id_of(task_id: str, status: int, offered_id: str, drawn: bool) -> TaskId:
    """The :class:`TaskId` for one offer script reply. ``drawn``: the queue drew
    ``offered_id``, so finding it already stored with this content (status 0) means an
    earlier attempt of this very call wrote it before its reply was lost: created here."""
    if status == 0 and drawn and task_id == offered_id:
        return TaskId(task_id, OfferOutcome.CREATED)
    return TaskId(task_id, _OUTCOMES[status])


def task_ids_of(
    replies: Sequence[Sequence[Any]], specs: Sequence[OfferSpec], drawn: Sequence[bool]
) -> tuple[list[TaskId], list[int]]:
    """What each offer of one call did, in order, from the offer script's replies (one per
    chunk of ``specs``): the :class:`TaskId` per offer, and the raw statuses."""
    statuses = list(chain.from_iterable(reply[1::2] for reply in replies))
    if statuses.count(1) == len(statuses):
        # Every task created (the usual bulk call): the ids are the ones offered, made into
        # TaskIds without a Python-level call per task.
        return list(map(str.__new__, repeat(TaskId), map(itemgetter(0), specs))), statuses
    pairs = [pair for reply in replies for pair in parse_offer(reply)]
    return [
        task_id_of(task_id, status, spec.id, own)
        for (task_id, status), spec, own in zip(pairs, specs, drawn, strict=True)
    ], statuses


class OfferOptions(TypedDict, total=False):
    """The keyword options of every offer, declared once: ``DelayQueue.offer`` and
    ``AsyncDelayQueue.offer``, the outbox's ``offer`` and Django's helpers take them as
    ``**options`` (see :meth:`DelayQueue.offer` for what each does). A wrapper of ``offer``
    can take them the same way: ``def offer(payload, **options: Unpack[OfferOptions])``.

    ``at``: an aware datetime or epoch seconds, instead of a delay. ``key``: a dedup key.
    ``id``: the task's own id (an offer repeated with it is a no-op). ``priority``: higher
    first among tasks due at once (0 by default). ``headers``: string metadata handed to the
    consumer. ``ttl``: drop the task if not delivered that long after its due time.
    ``key_ttl``: keep the key taken that long after the task completes. ``dedup``: ``"keep"``
    or ``"replace"``, overriding the queue's. ``limit_key``: the key whose limits
    (``q.limits``) the task runs under, e.g. a tenant. Durations are seconds or a
    ``timedelta``.
    """

    at: datetime | float | None
    key: str | None
    id: str | None
    priority: int
    headers: dict[str, str] | None
    ttl: Duration | None
    key_ttl: Duration | None
    dedup: str | None
    limit_key: str | None


OFFER_OPTIONS: Final = OfferOptions.__optional_keys__


def check_options(options: Mapping[str, object], caller: str) -> None:
    """Refuse a keyword that no offer takes, as Python would for a declared signature (with
    the nearest option's name, so that a typo is no silent no-op)."""
    for name in options:
        if name not in OFFER_OPTIONS:
            close = difflib.get_close_matches(name, sorted(OFFER_OPTIONS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")


def check_dedup(dedup: object) -> DedupMode | None:
    """The dedup mode an offer names (None: the queue's own); ConfigError for another value."""
    return None if dedup is None else dedup_mode(dedup)


def offer_of(payload: Any, delay: Duration | None, options: OfferOptions, caller: str) -> Offer:
    """The :class:`Offer` of one call's arguments; TypeError for an unknown option."""
    check_options(options, caller)
    return Offer(
        payload,
        delay,
        options.get("at"),
        options.get("key"),
        options.get("id"),
        options.get("priority", 0),
        options.get("headers"),
        options.get("ttl"),
        options.get("key_ttl"),
        options.get("limit_key"),
    )


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
    limit_key: str | None = None  # the key whose limits it runs under (see q.limits)


def is_plain(offer: Offer) -> bool:
    """Only a payload and a delay: no key, id, due time, priority, headers or ttl."""
    return (
        offer.key is None
        and offer.id is None
        and offer.at is None
        and offer.ttl is None
        and offer.key_ttl is None
        and offer.priority == 0
        and not offer.headers
        and offer.limit_key is None
    )


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
        offer_options(priority, key, key_ttl_ms, ttl_ms, offered_limit_key(offer.limit_key)),
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


def check_conflicts(results: list[TaskId]) -> list[TaskId]:
    """``results``, unless an offer's own id is held by a task with other content: then
    :class:`TaskIdConflict`, carrying every result (the other offers were written)."""
    conflicts = [task_id for task_id in results if task_id.outcome is OfferOutcome.CONFLICT]
    if not conflicts:
        return results
    shown = ", ".join(repr(str(task_id)) for task_id in conflicts[:3])
    more = f" and {len(conflicts) - 3} more" if len(conflicts) > 3 else ""
    raise TaskIdConflict(
        f"task id {shown}{more} is held by a task with other content: that task is kept "
        "unchanged, this offer was not written (offer again with another id, or cancel first)",
        [str(task_id) for task_id in conflicts],
        list(results),
    )
