"""The way off Redisson's ``RDelayedQueue`` (deprecated since Redisson 3.46): read and write
its storage from Python (docs/migration/redisson.md).

- :class:`RedissonDelayedQueue` / :class:`AsyncRedissonDelayedQueue` offer in Redisson's own
  format, so Java consumers still on Redisson take what Python services offer.
- :class:`Migration` / :class:`AsyncMigration` move a live Redisson delayed queue into a
  delayq queue, due times kept, once each, while Java producers keep offering
  (``delayq redisson migrate``).
"""

from __future__ import annotations

from .._core.redisson import MemberFormat, RedissonCodec, RedissonKeys
from .._core.redisson_moves import Backlog, Counts, Summary
from ._async.migrate import AsyncMigration
from ._async.producer import AsyncRedissonDelayedQueue
from ._sync.migrate import Migration
from ._sync.producer import RedissonDelayedQueue

__all__ = [
    "AsyncMigration",
    "AsyncRedissonDelayedQueue",
    "Backlog",
    "Counts",
    "MemberFormat",
    "Migration",
    "RedissonCodec",
    "RedissonDelayedQueue",
    "RedissonKeys",
    "Summary",
]
