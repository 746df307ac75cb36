"""Offers sent to Redis by ``transaction.on_commit``: for projects that do not want an outbox.

The task is offered right after the transaction commits, and never for one that rolls back.
What this cannot do, and the outbox can:

- a process that dies between the commit and the callback (a crash, a deploy's SIGKILL, an
  out-of-memory kill) loses the task: the order exists and nothing will ever close it;
- Redis unreachable at commit time loses it too: the callback logs the error (on the
  ``delayq.django`` logger, with the task id) and cannot undo the commit.

So the database and Redis can disagree; a periodic reconciliation job that finds rows
without their task is the safety net (docs/exactly-once.md). Arguments are checked and the
payload encoded before the callback is registered, so bad input raises inside the
transaction, not after it.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Unpack

from django.db import transaction

from ..._core import tracing
from ..._core.offers import OfferOptions, build_offer, check_dedup, offer_of
from ..._core.timing import Duration
from ...exceptions import DelayqError
from ...outbox import QueueFormat
from .conf import delayq_settings
from .outbox import format_options
from .queues import get_queue

log = logging.getLogger("delayq.django")


def offer_on_commit(
    queue: str,
    payload: Any,
    delay: Duration | None = None,
    *,
    using: str | None = None,
    **options: Unpack[OfferOptions],
) -> str:
    """Offer ``payload`` to ``queue`` once the transaction on ``using`` commits (at once
    outside a transaction); the same options as ``DelayQueue.offer``
    (:class:`~delayq.OfferOptions`).

    Returns the id the task will have (drawn now, so it can be stored in the same
    transaction). With ``key`` and ``dedup="keep"``, a live task already holding the key
    keeps its own id and this one is not created. ``delay`` counts from the commit.
    """
    offer = offer_of(payload, delay, options, "offer_on_commit")
    queue_options = delayq_settings().queue(queue).options
    codec = QueueFormat(**format_options(queue_options)).envelope_codec()
    task_id = build_offer(codec, offer).id  # validates everything, draws the id
    check_dedup(options.get("dedup"))  # a bad one would fail only after the commit
    sent = options.copy()
    sent["id"] = task_id
    traced = tracing.with_trace_context(options.get("headers"))  # the caller's span, not the
    if traced:  # commit's (which may run after it ended: ATOMIC_REQUESTS)
        sent["headers"] = dict(traced)
    send = partial(get_queue(queue).offer, payload, delay, **sent)
    transaction.on_commit(partial(_after_commit, send, queue, task_id, "offer"), using=using)
    return task_id


def cancel_on_commit(queue: str, task_id: str, *, using: str | None = None) -> None:
    """Cancel a task once the transaction on ``using`` commits (at once outside one)."""
    send = partial(get_queue(queue).cancel, task_id)
    transaction.on_commit(partial(_after_commit, send, queue, task_id, "cancel"), using=using)


def _after_commit(send: Any, queue: str, task_id: str, what: str) -> None:
    # Raising here would not undo the commit; it would only turn the caller's committed work
    # into an error and skip the other callbacks. Say loudly what was lost instead.
    try:
        send()
    except DelayqError as exc:
        log.error(
            "delayq %s of task %s on queue %s lost after its transaction committed: %s",
            what, task_id, queue, exc,
        )  # fmt: skip
