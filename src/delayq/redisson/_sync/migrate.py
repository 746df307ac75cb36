# Generated from _async/migrate.py by scripts/unasync.py: do not edit.
"""Migration: move a live Redisson ``RDelayedQueue`` into a delayq queue, due times
kept, while Java producers keep offering.

Two ways to move a batch, chosen from where the keys live:

- **atomic** (the delayq queue's keys share Redisson's ``{NAME}`` slot, or the server is not
  a cluster): one script takes the members out of Redisson and writes them as delayq tasks.
- **claims** (a cluster, and the delayq queue is named otherwise): three scripts. A claim
  takes the members out of Redisson into a claims hash in Redisson's slot; a land writes them
  into delayq under a receipt naming the batch; a release drops the claim. A run that was
  killed finds its claims and lands them again: the receipt makes the second landing write
  nothing, so every member is delivered once.

The sync ``Migration`` in ``_sync/migrate.py`` is generated from this file by
``scripts/unasync.py``; edit here and regenerate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Self

from redis.crc import key_slot

from ..._core import protocol, sharding
from ..._core.connection import Topology
from ..._core.envelope import EnvelopeCodec
from ..._core.keys import QueueKeys
from ..._core.protocol import new_nonce
from ..._core.redisson import RedissonKeys, codec_of
from ..._core.redisson_moves import (
    Backlog,
    Counts,
    Decoding,
    Prepared,
    Source,
    Summary,
    claimed,
    land_args,
    move_args,
    statuses,
)
from ..._core.scripts import Op
from ..._core.timing import Duration, setting_s
from ..._sync import backend, runner
from ...exceptions import ConfigError

log = logging.getLogger("delayq")

BATCH = 100  # members per script call, as Redisson's own transfer
CLAIM_RECEIPT_S = 7 * 24 * 3600  # how long a landed batch is remembered for a rerun
ATOMIC, CLAIMS = "atomic", "claims"


class Migration:
    """Moves the Redisson delayed queue ``name`` into the delayq queue ``to``.

    Args:
        name: the Redisson destination queue's name (``redisson_delay_queue_timeout:{name}``
            and its siblings hold the delayed tasks).
        to: the delayq queue (unsharded; reshard it after the move). Named ``name`` it shares
            Redisson's cluster slot and every batch moves in one atomic script.
        redis: a URL, a ``redis`` client or a connection handle.
        codec: the Redisson codec of the values: ``"string"`` or ``"json-jackson"``.
        keep_class: keep a JSON object's ``@class`` as the task header ``redisson-class``
            (True) or drop it (False).
        prefix: the delayq queue's key prefix.
        queue_codec: the delayq queue's codec (``"json"`` or ``"msgpack"``).
        batch: members per script call.
        path: ``"atomic"`` or ``"claims"`` to insist on one (None: the one the keys allow;
            atomic where the keys cannot share a slot is a :class:`ConfigError`).
        safety_interval: in follow mode, the longest wait for Redisson's channel before one
            look anyway (a lost message then costs that long, never a stall).
    """

    def __init__(
        self,
        name: str,
        to: str,
        redis: Any = None,
        *,
        codec: str = "string",
        keep_class: bool = True,
        prefix: str = "dq",
        queue_codec: str = "json",
        batch: int = BATCH,
        path: str | None = None,
        safety_interval: Duration = 10.0,
        reconnect_timeout: Duration | None = None,
    ) -> None:
        self.source = RedissonKeys(name)
        self.target = QueueKeys(prefix, to)
        if queue_codec not in ("json", "msgpack"):
            raise ConfigError(f"queue_codec must be 'json' or 'msgpack', not {queue_codec!r}")
        if not isinstance(batch, int) or not 1 <= batch <= 1000:
            raise ConfigError(f"batch must be 1-1000 members, not {batch!r}")
        if path not in (None, ATOMIC, CLAIMS):
            raise ConfigError(f"path must be 'atomic' or 'claims', not {path!r}")
        self._decoding = Decoding(codec_of(codec), EnvelopeCodec(queue_codec), keep_class)
        self._batch = batch
        self._wanted_path = path
        self._path: str | None = None
        self._safety_s = setting_s(safety_interval, "safety_interval", allow_zero=False)
        reconnect_s = None
        if reconnect_timeout is not None:
            reconnect_s = setting_s(reconnect_timeout, "reconnect_timeout")
        self._runner = runner.connect(redis, f"delayq-migrate:{name}", reconnect_s, label=to)
        self._owns_runner = not runner.shared(redis)
        if self._runner.topology is Topology.CLUSTER:  # consumers there listen on a shard channel
            self.target = QueueKeys(prefix, to, sharded_channel=True)
        self.counts = Counts()

    # -- planning ---------------------------------------------------------------------------

    def path(self) -> str:
        """How batches move here: ``"atomic"`` or ``"claims"`` (checked once: the target
        must be unsharded, and a wanted atomic path must be possible)."""
        if self._path is not None:
            return self._path
        conn, target = self._runner, self.target
        layout = conn.command("HGET", sharding.shards_key(target.prefix), target.name)
        if sharding.recorded_layout(layout) is not None:
            raise ConfigError(
                f"queue {target.name!r} is sharded: migrate into an unsharded queue, then "
                f"`delayq reshard {target.name} --shards N`"
            )
        cluster = conn.topology is Topology.CLUSTER
        same_slot = key_slot(target.key("delayed").encode()) == key_slot(
            self.source.timeouts.encode()
        )
        possible = ATOMIC if same_slot or not cluster else CLAIMS
        if self._wanted_path == ATOMIC and possible != ATOMIC:
            raise ConfigError(
                f"an atomic move needs the delayq queue in Redisson's slot: name it "
                f"{self.source.name!r} (queue {target.name!r} is in another cluster slot)"
            )
        self._path = self._wanted_path or possible
        return self._path

    def describe(self, path: str) -> str:
        """The move path in words, for the summary."""
        if path == ATOMIC:
            return f"atomic: one script per batch of {self._batch} (Redisson's slot)"
        return (
            f"claims + receipts: {self._batch} per batch, claim in Redisson's slot, land "
            "in the queue's, release"
        )

    def backlog(self) -> Backlog:
        """What the Redisson queue holds now."""
        keys, conn = self.source, self._runner
        now = int(time.time() * 1000)
        first = conn.command("ZRANGE", keys.timeouts, 0, 0, "WITHSCORES")
        last = conn.command("ZRANGE", keys.timeouts, -1, -1, "WITHSCORES")
        return Backlog(
            pending=int(conn.command("ZCARD", keys.timeouts)),
            listed=int(conn.command("LLEN", keys.members)),
            ready=int(conn.command("LLEN", keys.destination)),
            claimed=int(conn.command("HLEN", keys.claims)),
            due_now=int(conn.command("ZCOUNT", keys.timeouts, "-inf", now)),
            first_due_ms=_score_of(first),
            last_due_ms=_score_of(last),
        )

    def preview(
        self, limit: int = 5, scan: int = 100_000
    ) -> tuple[Backlog, Counts, list[Prepared]]:
        """A dry run: the backlog, the member formats and undecodable members among the first
        ``scan`` members (in offer order), and the first ``limit`` tasks as they would be
        written. Nothing is changed."""
        backlog = self.backlog()
        counts, first = Counts(), list[Prepared]()
        conn, keys = self._runner, self.source
        for start in range(0, min(backlog.listed, scan), 1000):
            raws = conn.command("LRANGE", keys.members, start, start + 999)
            for raw in raws:
                item = self._decoding.pending(raw)
                if item.format is None:
                    counts.dead_lettered += 1
                else:
                    kind = item.format.value
                    counts.by_format[kind] = counts.by_format.get(kind, 0) + 1
                if len(first) < limit:
                    first.append(item)
        if len(first) < limit:
            ready = conn.command("LRANGE", keys.destination, 0, limit - len(first) - 1)
            first += [self._decoding.ready(raw, "preview", i) for i, raw in enumerate(ready)]
        return backlog, counts, first

    # -- moving -----------------------------------------------------------------------------

    def step(self) -> int:
        """Move one batch (the ready list first, then members due now, then in offer order);
        how many members left Redisson (0: nothing left to move)."""
        path = self.path()
        keys, n = self.source, self._batch
        now = int(time.time() * 1000)
        reads: list[tuple[Source, tuple[Any, ...]]] = [
            (Source.READY, ("LRANGE", keys.destination, 0, n - 1)),
            (Source.PENDING, ("ZRANGEBYSCORE", keys.timeouts, "-inf", now, "LIMIT", 0, n)),
            (Source.PENDING, ("LRANGE", keys.members, 0, n - 1)),
            # members the list lost (or never had): the ZSET is what Redisson delivers from
            (Source.PENDING, ("ZRANGE", keys.timeouts, 0, n - 1)),
        ]
        for source, command in reads:
            raws = self._runner.command(*command)
            if not raws:
                continue
            nonce = new_nonce()
            if source is Source.READY:
                items = [self._decoding.ready(raw, nonce, i) for i, raw in enumerate(raws)]
            else:
                items = [self._decoding.pending(raw) for raw in raws]
            if path == ATOMIC:
                left = self._move(source, items)
            else:
                left = self._claim_and_land(source, nonce, items)
            if left:
                return left
        return 0

    def _move(self, source: Source, items: list[Prepared]) -> int:
        keys = (*self.target.all, *self.source.all)
        reply = self._runner.run(Op.REDISSON_MOVE, keys, move_args(source, items))
        return self.counts.add(items, statuses(reply))

    def _claim_and_land(self, source: Source, nonce: str, items: list[Prepared]) -> int:
        src = self.source
        blob = self._runner.run(
            Op.REDISSON_CLAIM,
            (*src.all, src.claims),
            [source.value, nonce, *(item.raw for item in items)],
        )
        if not blob:
            self.counts.gone += len(items)
            return 0
        return self._land(nonce, blob)

    def _land(self, nonce: str, blob: bytes) -> int:
        """Land a claimed batch (again, after a crash: its receipt makes that once), then
        release the claim and the receipt."""
        items = []
        for i, (due_ms, raw) in enumerate(claimed(blob)):
            if due_ms < 0:
                item = self._decoding.ready(raw, nonce, i)
            else:
                item = self._decoding.pending(raw)
            items.append(_with_due(item, due_ms))
        receipt = self.target.receipt("redisson", nonce)
        reply = self._runner.run(
            Op.REDISSON_LAND,
            (*self.target.all, receipt),
            land_args(CLAIM_RECEIPT_S * 1000, items),
        )
        left = self.counts.add(items, statuses(reply))
        self._runner.run(Op.REDISSON_RELEASE, (self.source.claims,), [nonce])
        self._runner.command("DEL", receipt)
        return left

    def recover(self) -> int:
        """Land the batches a killed run claimed but did not release; how many members."""
        claims = self._runner.command("HGETALL", self.source.claims)
        landed = 0
        for nonce, blob in sorted(claims.items()):
            log.info("delayq: landing batch %s claimed by an interrupted migration", nonce)
            landed += self._land(nonce.decode(), blob)
        return landed

    def run(
        self,
        *,
        follow: bool = False,
        stop: Callable[[], bool] | None = None,
        on_batch: Callable[[Counts], None] | None = None,
    ) -> Summary:
        """Move everything there is; with ``follow``, keep moving new offers, woken by
        Redisson's own channel, until ``stop()`` is true. The summary of the run."""
        started, began = datetime.now(UTC), time.monotonic()
        path = self.path()
        self._runner.command("SADD", self.target.registry, self.target.name)  # known now
        before = self.backlog()
        notifier = None
        if follow:  # subscribed before the first look: no offer slips between the two
            notifier = self._runner.subscriber.notifier(self.source.channel)
            notifier.start()
        try:
            self.recover()
            while not (stop is not None and stop()):
                mark = notifier.mark() if notifier is not None else 0
                moved = self.step()
                if moved:
                    if on_batch is not None:
                        on_batch(self.counts)
                    continue
                if notifier is None:
                    break
                self._wait(notifier, mark, stop)
        finally:
            if notifier is not None:
                notifier.close()
        after = self.backlog()
        return Summary(
            self.source.name,
            self.target.name,
            self.describe(path),
            started.isoformat(timespec="seconds"),
            time.monotonic() - began,
            self.counts,
            before,
            after,
        )

    def _wait(self, notifier: Any, mark: int, stop: Callable[[], bool] | None) -> None:
        """Until Redisson's channel says a new head was offered (or a safety interval), in
        short waits so that ``stop`` is seen soon. Java timers moving due tasks to the ready
        list publish nothing: the safety interval bounds how long those wait."""
        deadline = backend.monotonic() + self._safety_s
        while backend.monotonic() < deadline:
            if stop is not None and stop():
                return
            if notifier.wait(mark, min(0.25, deadline - backend.monotonic())) is not None:
                return

    def close(self) -> None:
        """Close the connections this migration made (not a client or handle passed in)."""
        if self._owns_runner:
            self._runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _with_due(item: Prepared, due_ms: int) -> Prepared:
    return Prepared(item.raw, item.task_id, item.envelope, item.error, item.format, due_ms)


def _score_of(reply: Any) -> int | None:
    """The score of a one-member ``ZRANGE ... WITHSCORES`` reply (flat, or pairs as redis-py
    parses it)."""
    pairs = protocol.score_pairs(reply)
    return int(float(pairs[0][1])) if pairs else None
