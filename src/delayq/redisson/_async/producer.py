"""AsyncRedissonDelayedQueue: offer to a Redisson ``RDelayedQueue`` from Python, in exactly
the storage Redisson's own ``offer`` writes, so Java consumers still on Redisson take it.

The sync ``RedissonDelayedQueue`` in ``_sync/producer.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import time
from typing import Any, Self

from ..._async import runner
from ..._core.redisson import MemberFormat, RedissonKeys, codec_of, encode_value, pack_member
from ..._core.scripts import Op
from ..._core.timing import Duration, duration_ms, setting_s
from ...exceptions import ConfigError, RedisUnavailable, ServerError


class AsyncRedissonDelayedQueue:
    """The producer side of a Redisson ``RDelayedQueue`` whose destination queue is ``name``.

    Args:
        name: the destination queue's name, as Java passes it to ``getBlockingQueue``.
        redis: a URL, a ``redis.asyncio`` client, or a connection handle, as for
            :class:`~delayq.AsyncDelayQueue`.
        codec: the Redisson codec the Java side uses: ``"string"`` (``StringCodec``) or
            ``"json-jackson"`` (``JsonJacksonCodec``).
        member_format: ``"3.21.1+"`` (default) or ``"pre-3.21.1"``, for Java services on a
            Redisson older than 3.21.1 (the two cannot read each other's members).
        reconnect_timeout: seconds a call rides out a lost connection (None: the default of
            the topology).

    Due times are the offering client's clock plus the delay, as in Redisson's design (its
    timers also judge them by their own clocks): keep the hosts' clocks in sync. delayq's own
    queues use Redis's clock instead.
    """

    def __init__(
        self,
        name: str,
        redis: Any = None,
        *,
        codec: str = "string",
        member_format: str = MemberFormat.CURRENT.value,
        reconnect_timeout: Duration | None = None,
    ) -> None:
        self._keys = RedissonKeys(name)
        self._codec = codec_of(codec)
        try:
            self._format = MemberFormat(member_format)
        except ValueError:
            known = ", ".join(f.value for f in MemberFormat)
            raise ConfigError(f"unknown member_format {member_format!r}: use {known}") from None
        reconnect_s = None
        if reconnect_timeout is not None:
            reconnect_s = setting_s(reconnect_timeout, "reconnect_timeout")
        self._runner = runner.connect(redis, f"delayq-redisson:{name}", reconnect_s, label=name)
        self._owns_runner = not runner.shared(redis)

    @property
    def name(self) -> str:
        """The destination queue's name."""
        return self._keys.name

    @property
    def keys(self) -> RedissonKeys:
        """The Redis keys of the Redisson queue."""
        return self._keys

    async def offer(self, value: Any, delay: Duration, *, java_class: str | None = None) -> None:
        """``RDelayedQueue.offer(value, delay)``: ``value`` reaches the destination list when
        a Redisson client's timer finds it due. ``value`` is a ``str`` for StringCodec, any
        JSON value for JsonJacksonCodec, with ``java_class`` as its ``@class`` so that Java
        reads it back as that class. Safe to retry: a resent offer does not add it twice."""
        delay_ms = duration_ms(delay)
        member = pack_member(encode_value(value, self._codec, java_class), self._format)
        due_ms = int(time.time() * 1000) + delay_ms
        keys = self._keys
        try:
            await self._runner.run(
                Op.REDISSON_OFFER,
                (keys.destination, keys.timeouts, keys.members, keys.channel),
                (due_ms, member),
            )
        except (RedisUnavailable, ServerError) as exc:
            raise type(exc)(f"Redisson queue {self.name!r}: {exc}") from exc

    async def close(self) -> None:
        """Close the connections this object made (not a client or handle passed in)."""
        if self._owns_runner:
            await self._runner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
