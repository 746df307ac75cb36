"""The transactional outbox on Django's own database connection.

``offer``/``cancel``/``reschedule`` write a row of :mod:`delayq.outbox` through the psycopg 3
connection under Django's, so the row commits or rolls back with the ``transaction.atomic()``
block around it (savepoints included); ``manage.py delayq_relay`` moves committed rows to
Redis. The outbox encodes payloads with the queue's own ``OPTIONS`` (``codec``,
``payload_type``, ``max_payload_bytes``, ``dedup``), as ``DelayQueue.offer`` would.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Unpack

from django.core.signals import setting_changed

from ..._core.offers import OfferOptions, check_options
from ..._core.timing import Duration
from ...outbox import Outbox, QueueFormat
from ...outbox._schema import Schema
from .conf import delayq_settings
from .database import alias_of, check_postgresql, conninfo, raw_connection

# The DelayQueue options that decide how a task is encoded, which the outbox must share.
# (durability: the relay waits for it before it deletes the rows, as an offer would.)
_FORMAT_OPTIONS = ("codec", "payload_type", "max_payload_bytes", "dedup", "durability")

_lock = threading.Lock()
_outboxes: dict[str, Outbox] = {}


def get_outbox(using: str | None = None) -> Outbox:
    """The :class:`~delayq.outbox.Outbox` of Django's database ``using`` (default
    ``DELAYQ["DATABASE"]``), with the queues' encodings from ``DELAYQ["QUEUES"]``."""
    alias = alias_of(using)
    with _lock:
        found = _outboxes.get(alias)
        if found is None:
            conf = delayq_settings()
            formats = {
                name: QueueFormat(**format_options(queue.options))
                for name, queue in conf.queues.items()
            }
            found = _outboxes[alias] = Outbox(conninfo(alias), prefix=conf.prefix, queues=formats)
        return found


def format_options(queue_options: dict[str, Any]) -> dict[str, Any]:
    """The part of a queue's ``OPTIONS`` that decides how its tasks are encoded."""
    return {k: v for k, v in queue_options.items() if k in _FORMAT_OPTIONS}


def offer(
    queue: str,
    payload: Any,
    delay: Duration | None = None,
    *,
    using: str | None = None,
    **options: Unpack[OfferOptions],
) -> str:
    """Offer ``payload`` to ``queue`` if and only if the current transaction commits.

    Call it inside ``transaction.atomic(using=...)``; outside one, Django is in autocommit
    and the row commits at once. The same options as ``DelayQueue.offer``
    (:class:`~delayq.OfferOptions`); bad input raises here, inside the transaction. Returns
    the task's delayq id (for ``get`` and ``cancel``). ``delay`` counts from now, on the
    database's clock, however late the relay runs.
    """
    check_options(options, "offer")  # before the connection is looked up
    return get_outbox(using).offer(raw_connection(using), queue, payload, delay, **options)


def cancel(queue: str, task_id: str, *, using: str | None = None) -> None:
    """Cancel a task if and only if the current transaction commits (an offer not relayed
    yet never reaches Redis)."""
    get_outbox(using).cancel(raw_connection(using), queue, task_id)


def reschedule(
    queue: str,
    task_id: str,
    delay: Duration | None = None,
    *,
    at: datetime | float | None = None,
    using: str | None = None,
) -> None:
    """Move a waiting task to ``delay`` from now (or ``at``) if the transaction commits."""
    get_outbox(using).reschedule(raw_connection(using), queue, task_id, delay, at=at)


def migrate_install(schema_editor: Any) -> None:
    """Create the outbox table in the database being migrated, with :mod:`delayq.outbox`'s
    own (idempotent) DDL; other databases than ``DELAYQ["DATABASE"]`` are left alone."""
    if _is_outbox_database(schema_editor):
        for statement in Schema().install():
            schema_editor.execute(statement)


def migrate_uninstall(schema_editor: Any) -> None:
    """Drop the outbox table and its trigger function (migrating the app back to zero)."""
    if _is_outbox_database(schema_editor):
        schema = Schema()
        schema_editor.execute(f"DROP TABLE IF EXISTS {schema.qualified}")
        schema_editor.execute(f'DROP FUNCTION IF EXISTS "{schema.table}_notify"()')


def _is_outbox_database(schema_editor: Any) -> bool:
    connection = schema_editor.connection
    if connection.alias != delayq_settings().database:
        return False
    check_postgresql(connection)
    return True


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting in ("DELAYQ", "DATABASES"):
        with _lock:
            _outboxes.clear()


setting_changed.connect(_on_setting_changed)
