"""A transactional outbox on PostgreSQL: tasks that exist if and only if their transaction
committed (the ``postgres`` extra: ``pip install 'delayq[postgres]'``; docs/outbox.md).

- :class:`Outbox` / :class:`AsyncOutbox` write offers, cancels and reschedules as rows in the
  caller's own transaction (psycopg 3 or SQLAlchemy 2 connections).
- :class:`Relay` / :class:`AsyncRelay` move committed rows into their queues, woken by
  LISTEN/NOTIFY; ``delayq relay`` runs one.
"""

from __future__ import annotations

from ._async.outbox import AsyncOutbox
from ._metrics import OutboxCollector
from ._relay import AsyncRelay, RelayStats
from ._rows import QueueFormat
from ._sync.outbox import Outbox
from ._threaded import Relay
from ._values import DeadRow, OutboxStatus, QueueBacklog

__all__ = [
    "AsyncOutbox",
    "AsyncRelay",
    "DeadRow",
    "Outbox",
    "OutboxCollector",
    "OutboxStatus",
    "QueueBacklog",
    "QueueFormat",
    "Relay",
    "RelayStats",
]
