"""AsyncRelay and Relay: move committed outbox rows into their delayq queues.

A relay LISTENs on the outbox's channel and, when a commit wakes it (or every
``sweep_interval``, in case a notification was lost), claims pending rows in batches with
``SELECT ... FOR UPDATE SKIP LOCKED``, applies them to Redis and deletes them in the same
database transaction. Hence:

- any number of relays can run: a row is held by one relay at a time;
- a relay that dies mid-batch applied nothing to the database: its rows unlock and are
  offered again, under the ids the producers drew, so Redis matches them to the tasks already
  written (an offer of a live task's id with the same content is a no-op);
- Redis down or hung: the batch rolls back, the rows wait and flow once Redis answers;
- PostgreSQL down: the relay reconnects with backoff, then sweeps what it may have missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._async.connection import AsyncConnection, shared_or_new
from .._async.queue import AsyncDelayQueue
from .._core.durability import Durability
from .._core.models import DedupMode
from .._core.outages import refused_for_now
from .._core.text import printable
from .._core.timing import Duration, duration_ms, setting_s
from .._core.urls import without_secrets_of
from ..exceptions import (
    ConfigError,
    DelayqError,
    InvalidTaskError,
    NotDurable,
    RedisUnavailable,
    ServerError,
)
from . import _heartbeat as heartbeat
from ._apply import (
    APPLIED_BEFORE,
    CONFLICT,
    DEFAULT_RETENTION_S,
    DEFAULT_SETTLE_S,
    Outcome,
    Receipts,
)
from ._conn import check_dsn, require_psycopg
from ._rows import Claimed, QueueFormat, check_row
from ._schema import DEFAULT_BATCH, DEFAULT_BATCH_BYTES, Schema, for_psycopg

log = logging.getLogger("delayq.outbox")

_FIRST_BACKOFF_S: Final = 0.05
APP_NAME: Final = "delayq-relay"  # pg_stat_activity's application_name of a relay's sessions
DEFAULT_RECONNECT_S: Final = 5.0  # a Redis call's retries before the batch rolls back
# Errors after which the whole batch rolls back and is claimed again (its rows applied so far
# are refused by their receipts then): Redis away, or a write not confirmed durable.
_RETRY_BATCH: Final = (RedisUnavailable, ServerError, NotDurable)
_DEFAULT_FORMAT: Final = QueueFormat()
_LONGEST_WAIT_S: Final = 3600.0  # sweep_interval, max_backoff: inf or nan would never wake
LARGEST_BATCH_BYTES: Final = 1 << 30  # batch_bytes: a GiB a batch would bound nothing useful
_LOGGED_CHARS: Final = 500  # of a row's error in a log line (the table keeps 4,000)
_SESSION_DEFAULTS: Final = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms that sent data may stay unacknowledged
}
_CONFLICT: Final = "the id is held by a task with other content, which is kept unchanged"


def _wait_s(value: object, what: str) -> float:
    """``sweep_interval`` or ``max_backoff`` (seconds or a timedelta) in seconds."""
    seconds = setting_s(value, what, allow_zero=False)
    if seconds > _LONGEST_WAIT_S:
        raise ConfigError(f"{what} must be at most {_LONGEST_WAIT_S:g} s, got {value!r}")
    return seconds


def truncated(text: str, limit: int = _LOGGED_CHARS) -> str:
    """``text`` made printable and cut to ``limit`` characters, for a log line."""
    if len(text) <= limit:
        return printable(text)
    return f"{printable(text[:limit])}... ({len(text)} characters)"  # cut first: it may be MBs


class Outage:
    """The relay's failures since its last batch that went through: the wait before the next
    try doubles up to ``longest``, and an outage is logged once when it starts (each further
    failure at DEBUG) and once when it ends."""

    def __init__(self, first: float, longest: float) -> None:
        self._first, self._longest = first, longest
        self._wait = first
        self.failures = 0
        self._since = 0.0

    def failed(self, what: str, error: str, *, exc_info: bool = False) -> float:
        """Note one failure; the seconds to wait before the next try."""
        wait = self._wait
        if self.failures == 0:
            self._since = time.monotonic()
            log.warning(
                "outbox relay: %s: %s; retrying with backoff up to %.2fs (logged again when "
                "a batch goes through)", what, error, self._longest, exc_info=exc_info,
            )  # fmt: skip
        else:
            log.debug("outbox relay: %s: %s; again in %.2fs", what, error, wait)
        self.failures += 1
        self._wait = min(wait * 2, self._longest)
        return wait

    def ended(self) -> None:
        if self.failures:
            log.warning(
                "outbox relay: recovered after %d failed attempt(s) over %.1fs",
                self.failures, time.monotonic() - self._since,
            )  # fmt: skip
        self.failures, self._wait = 0, self._first


@dataclass(slots=True)
class RelayStats:
    """What one relay did since it started (its own work, not the other relays')."""

    offered: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    dead: int = 0
    batches: int = 0
    reconnects: int = 0
    last_lag_s: float | None = None  # age of the oldest row of the last batch, DB clock
    redis_errors: int = 0
    database_errors: int = 0
    duplicates: int = 0  # rows claimed again after they were applied: refused by Redis
    missing: int = 0  # cancels and reschedules that found no waiting task
    # Bytes of envelopes and options the last batch, and the largest one, brought into memory.
    last_batch_bytes: int = 0
    largest_batch_bytes: int = 0


class AsyncRelay:
    """Relays committed outbox rows to Redis until :meth:`stop` (see the module docstring).

    Args:
        dsn: the PostgreSQL connection string (the relay keeps two connections: one LISTENs,
            one claims rows).
        redis: a Redis URL or ``redis.asyncio`` client, as for ``AsyncDelayQueue``, or a
            connection handle (:func:`delayq.aconnect`, shared and left open). Every queue
            the relay feeds, of any prefix, is opened on one handle: one pool per Redis
            node, not one per queue.
        table, schema: the outbox table, as given to the ``Outbox``.
        batch_size: rows claimed per database transaction.
        batch_bytes: and at most this many bytes of envelopes and options per transaction
            (default 4 MiB): the claim stops counting rows in at the bound, so a batch brings
            at most that much into memory (a single larger row goes alone; one over its
            queue's ``max_payload_bytes`` goes dead unread).
        sweep_interval: seconds between looks at the table when no notification arrives;
            only bounds the delay of a row whose notification was lost.
        reconnect_timeout: how long one Redis call keeps retrying before the batch rolls
            back (seconds or a timedelta); None: 5 s, or a handle's own.
        max_backoff: the longest wait between reconnection attempts.
        name: the relay's ``application_name`` in ``pg_stat_activity``.
        durability: a :class:`~delayq.Durability` for every queue the relay writes to: it
            waits for the copies before it deletes the rows, and a shortfall
            (:class:`~delayq.NotDurable`) rolls the batch back to be retried (the rows stay);
            a queue in ``queues`` with a durability of its own uses that.
        queues: per-queue :class:`QueueFormat` (by queue name), as given to the ``Outbox``:
            the relay uses their ``max_payload_bytes`` (a larger row goes dead) and
            ``durability``.
        prefixes, only_queues: serve only the rows of these key prefixes and queue names
            (default: every row), e.g. one relay per team's prefix.
        receipt_retention: how long Redis refuses a row applied by a batch that has not
            committed (its DELETE failed, its relay died): a row claimed again within it
            changes nothing. Seconds or a timedelta; default 24 hours. Once the batch
            commits, its receipts are kept only 2 minutes more.
    """

    def __init__(
        self,
        dsn: str,
        redis: Any = None,
        *,
        table: str = "delayq_outbox",
        schema: str | None = None,
        batch_size: int = DEFAULT_BATCH,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        sweep_interval: Duration = 5.0,
        reconnect_timeout: Duration | None = None,
        max_backoff: Duration = 5.0,
        name: str = APP_NAME,
        receipt_retention: Duration = DEFAULT_RETENTION_S,
        durability: Durability | None = None,
        queues: Mapping[str, QueueFormat] | None = None,
        prefixes: Sequence[str] = (),
        only_queues: Sequence[str] = (),
    ) -> None:
        if not isinstance(name, str) or not name.isprintable() or not 0 < len(name) < 64:
            raise ConfigError(f"name must be 1-63 printable characters, got {name!r}")
        self.name = name
        if not isinstance(dsn, str) or not dsn:
            raise ConfigError("the relay needs a PostgreSQL DSN (a connection string)")
        check_dsn(dsn)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if (
            not isinstance(batch_bytes, int)
            or isinstance(batch_bytes, bool)
            or not 1 <= batch_bytes <= LARGEST_BATCH_BYTES
        ):
            raise ConfigError(
                f"batch_bytes must be an int from 1 to {LARGEST_BATCH_BYTES} (1 GiB), "
                f"got {batch_bytes!r}"
            )
        sweep_s, backoff_s = (
            _wait_s(sweep_interval, "sweep_interval"), _wait_s(max_backoff, "max_backoff")
        )  # fmt: skip
        if reconnect_timeout is None and not isinstance(redis, AsyncConnection):
            reconnect_timeout = DEFAULT_RECONNECT_S
        if reconnect_timeout is not None:
            try:
                duration_ms(reconnect_timeout, "reconnect_timeout", allow_zero=False)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        try:
            retention_ms = duration_ms(receipt_retention, "receipt_retention", allow_zero=False)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if retention_ms < DEFAULT_SETTLE_S * 1000:
            raise ConfigError(
                f"receipt_retention must be at least {DEFAULT_SETTLE_S:g} s (longer than any "
                f"retry of a batch), got {retention_ms / 1000:g} s"
            )
        self._receipts = Receipts(retention_ms / 1000, DEFAULT_SETTLE_S)
        if durability is not None and not isinstance(durability, Durability):
            raise ConfigError(f"durability must be a Durability, not {durability!r}")
        self._durability = durability
        self._formats: dict[str, QueueFormat] = {}
        for queue_name, fmt in (queues or {}).items():
            if not isinstance(fmt, QueueFormat):
                raise ConfigError(f"queues[{queue_name!r}] must be a QueueFormat, not {fmt!r}")
            fmt.options()  # checked now, as the queue would
            self._formats[queue_name] = fmt
        sizes = [f.max_payload_bytes for f in self._formats.values()]
        self._max_row_bytes = max([_DEFAULT_FORMAT.max_payload_bytes, *sizes])
        self._psycopg = require_psycopg()
        self._dsn = dsn
        self._redis = redis
        self._schema = Schema(table, schema)
        if isinstance(prefixes, str) or isinstance(only_queues, str):
            raise ConfigError("prefixes and only_queues are lists of names, not one string")
        self._claim_batch = self._schema.claim_batch(
            batch_size, self._max_row_bytes, list(prefixes), list(only_queues), batch_bytes
        )
        self._bury = for_psycopg(self._schema.bury)
        self._batch = batch_size
        self._sweep_s = sweep_s
        self._reconnect_timeout = reconnect_timeout
        # A handle passed in is checked now; one of the relay's own is made on first use,
        # in the loop that runs the relay.
        self._conn: AsyncConnection | None = None
        self._owns_conn = False
        if isinstance(redis, AsyncConnection):
            self._conn, self._owns_conn = shared_or_new(redis, reconnect_timeout=reconnect_timeout)
        self._queues: dict[tuple[str, str], AsyncDelayQueue] = {}
        self._known_queues: set[tuple[str, str]] = set()
        self._missed: list[int] = []  # the batch in hand's rows that found no task
        self._stop_event: asyncio.Event | None = None
        self._outage = Outage(_FIRST_BACKOFF_S, backoff_s)
        self._stopping = False
        self.stats = RelayStats()
        self.connected = asyncio.Event()  # set while both connections are up (for tests)

    # -- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to return after the batch in hand (call from the relay's loop)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    async def run(self) -> None:
        """Relay until :meth:`stop`; database and Redis outages are waited out, not raised."""
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        try:
            while not self._stopping:
                try:
                    await self._serve()
                except self._psycopg.Error as exc:
                    self.stats.database_errors += 1
                    shown = without_secrets_of(str(exc), self._dsn)  # a driver may quote it
                    wait = self._outage.failed("PostgreSQL", shown)
                except Exception as exc:  # a bug must not end the relay: rows wait, it retries
                    self.stats.database_errors += 1
                    wait = self._outage.failed("unexpected error", repr(exc), exc_info=True)
                else:
                    continue
                self.connected.clear()
                await self._pause(wait)
                self.stats.reconnects += 1
        finally:
            self.connected.clear()
            await self.close()
            log.info("outbox relay %s: stopped, %d rows offered", self.name, self.stats.offered)

    async def relay_pending(self) -> int:
        """Relay what is pending now, once, and return the rows handled (no LISTEN)."""
        conn = await self._connect()
        try:
            return await self._drain(conn, stop_when_idle=True)
        finally:
            await conn.close()

    async def close(self) -> None:
        """Close the relay's queues and its connection handle, unless it was given one
        (``run`` does it on return)."""
        queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            await queue.close()
        conn, self._conn = self._conn, None
        if conn is not None and self._owns_conn:
            await conn.close()

    async def __aenter__(self) -> AsyncRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _pause(self, seconds: float) -> None:
        assert self._stop_event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    async def _connect(self) -> Any:
        """A session of the relay: autocommit (it writes BEGIN/COMMIT itself), named, and with
        TCP keepalives, so that a link that died silently fails within about half a minute
        instead of leaving the relay waiting on it (settings in the DSN win)."""
        given = self._psycopg.conninfo.conninfo_to_dict(self._dsn)
        options = {k: v for k, v in _SESSION_DEFAULTS.items() if k not in given}
        return await self._psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, application_name=self.name, **options
        )

    # -- the loop ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        """One database session: LISTEN, then drain on every wake-up until stopped."""
        assert self._stop_event is not None
        async with await self._connect() as listener, await self._connect() as work:
            # LISTEN before the first drain: a commit between the two is caught by either.
            await listener.execute(self._schema.listen)
            wake = asyncio.Event()
            listening = asyncio.create_task(self._listen(listener, wake))
            stopping = asyncio.create_task(self._stop_event.wait())
            self.connected.set()
            log.info("outbox relay %s: listening on %r", self.name, self._schema.channel)
            try:
                while not self._stopping:
                    wake.clear()
                    await heartbeat.beat(self)  # liveness for the exporter (_heartbeat.py)
                    try:
                        await self._drain(work)
                    except _RETRY_BATCH as exc:  # the batch rolled back: rows wait for Redis
                        self.stats.redis_errors += 1
                        error = f"{type(exc).__name__}: {truncated(str(exc))}"  # NotDurable...
                        await self._pause(self._outage.failed("Redis", error))
                        continue
                    # Only a batch that went through ends an outage (not a reconnect: a
                    # commit that fails each time would otherwise retry at the first pace).
                    self._outage.ended()
                    woken = asyncio.create_task(wake.wait())
                    await asyncio.wait(
                        (woken, listening, stopping),
                        timeout=self._sweep_s,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    woken.cancel()
                    if listening.done():
                        listening.result()  # the LISTEN connection broke: raise its error
                        raise self._psycopg.OperationalError("the LISTEN connection closed")
            finally:
                self.connected.clear()
                for task in (listening, stopping):
                    task.cancel()
                await asyncio.gather(listening, stopping, return_exceptions=True)

    async def _listen(self, conn: Any, wake: asyncio.Event) -> None:
        async for _ in conn.notifies():
            wake.set()

    async def _drain(self, conn: Any, *, stop_when_idle: bool = False) -> int:
        """Claim, apply and delete batches until the table holds nothing this relay can take.

        ``conn`` is in autocommit mode and the relay writes BEGIN and COMMIT itself, so that a
        batch costs two round trips to the database: BEGIN, the claim's DECLARE and FETCH in
        one (before Redis: this is the commit-to-task latency), then DELETE and COMMIT in one.
        """
        handled = 0
        while not self._stopping or stop_when_idle:
            try:
                cur = await conn.execute(self._claim_batch)
                while cur.description is None and cur.nextset():
                    pass  # past BEGIN's and DECLARE's results to FETCH's rows
                names = [c.name for c in cur.description]
                fetched = [dict(zip(names, r, strict=True)) for r in await cur.fetchall()]
                rows = self._within_bytes(fetched)
                done, dead, missed = await self._apply(rows) if rows else ([], [], [])
                for seq, error in dead:
                    await conn.execute(self._bury, {"seq": seq, "error": error[:4000]})
                await conn.execute(self._schema.finish_claim(done, missed))
            except BaseException:
                self._receipts.forget()
                await self._rollback(conn)
                raise
            if not rows:
                return handled
            await self._settle()
            self.stats.batches += 1
            self.stats.last_lag_s = max(float(r["age_s"]) for r in rows)
            handled += len(rows)
            if len(fetched) < self._batch and len(rows) == len(fetched):
                return handled  # the table had no more (rows left by the byte bound wait)
        return handled

    def _within_bytes(self, fetched: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The claimed rows within ``batch_bytes`` (the claim marks them ``in_batch``; those
        after came without their envelopes and stay pending for the next batch). Their bytes,
        as received, go to the stats: the measure of the bound."""
        rows = list(itertools.takewhile(lambda row: row["in_batch"], fetched))
        size = sum(len(r["envelope"] or b"") + len((r["options"] or "").encode()) for r in fetched)
        self.stats.last_batch_bytes = size
        self.stats.largest_batch_bytes = max(self.stats.largest_batch_bytes, size)
        if len(rows) < len(fetched):
            log.debug(
                "outbox relay: batch cut at %d of %d rows by batch_bytes (%d bytes)",
                len(rows), len(fetched), size,
            )  # fmt: skip
        return rows

    async def _settle(self) -> None:
        try:
            await self._receipts.settle()
        except DelayqError as exc:  # the receipts then expire at their full retention
            log.debug("outbox relay: could not settle receipts: %s", exc)

    async def _rollback(self, conn: Any) -> None:
        """End a failed batch: its rows unlock for any relay. A broken connection needs no
        rollback (the server ended the transaction) and is reported by the caller's error."""
        with contextlib.suppress(self._psycopg.Error):
            await conn.execute("ROLLBACK")

    # -- applying rows to Redis -------------------------------------------------------------

    async def _apply(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], list[tuple[int, str]], list[int]]:
        """Apply claimed rows in ``seq`` order per queue; the seqs to delete, the rows that
        cannot be applied, with why, and the cancels and reschedules that found no task. A
        Redis outage (or a durability shortfall) raises: the caller rolls back, and the rows
        applied meanwhile are refused by their receipts when they are claimed again."""
        done: list[int] = []
        dead: list[tuple[int, str]] = []
        self._missed = []
        per_queue: dict[tuple[str, str], list[Claimed]] = {}
        for row in rows:
            too_large = self._too_large(row)
            if too_large is not None:
                dead.append((int(row["seq"]), too_large))
                continue
            try:
                item = check_row(row, self._known_queues)
            except (InvalidTaskError, ConfigError) as exc:
                dead.append((int(row["seq"]), f"{type(exc).__name__}: {exc}"))
                continue
            per_queue.setdefault((item.prefix, item.queue), []).append(item)
        for (prefix, name), items in per_queue.items():
            applied: list[int] = []
            try:
                await self._apply_queue(self._queue(prefix, name), items, applied, dead)
            except _RETRY_BATCH:
                raise
            except Exception as exc:  # this queue alone cannot be served: its rows go dead
                reason = f"{type(exc).__name__}: {exc}"
                settled = set(applied) | {seq for seq, _ in dead} | set(self._missed)
                dead += [(item.seq, reason) for item in items if item.seq not in settled]
            done += applied
        self.stats.dead += len(dead)
        for seq, error in dead:
            log.error("outbox relay: row %d is dead: %s", seq, truncated(error))
        return done, dead, self._missed

    async def _apply_queue(
        self,
        queue: AsyncDelayQueue,
        items: list[Claimed],
        done: list[int],
        dead: list[tuple[int, str]],
    ) -> None:
        run: list[Claimed] = []
        for item in items:  # consecutive offers of one dedup mode go in one call
            if run and (item.op != "offer" or item.dedup != run[0].dedup):
                await self._offer_run(queue, run, done, dead)
                run = []
            if item.op == "offer":
                run.append(item)
            else:
                await self._apply_one(queue, item, done, dead)
        if run:
            await self._offer_run(queue, run, done, dead)

    def _queue(self, prefix: str, name: str) -> AsyncDelayQueue:
        queue = self._queues.get((prefix, name))
        if queue is None:
            if self._conn is None:
                self._conn, self._owns_conn = shared_or_new(
                    self._redis, reconnect_timeout=self._reconnect_timeout, client_name=APP_NAME
                )
            fmt = self._formats.get(name)
            durability = fmt.durability if fmt and fmt.durability else self._durability
            queue = self._conn.queue(name, prefix=prefix, durability=durability)
            self._queues[(prefix, name)] = queue
        return queue

    def _too_large(self, row: Mapping[str, Any]) -> str | None:
        """Why an offer row is over its queue's ``max_payload_bytes``, if it is (checked
        before the row is parsed: the claim did not even read an envelope over the largest)."""
        fmt = self._formats.get(row["queue"]) if isinstance(row["queue"], str) else None
        limit = fmt.max_payload_bytes if fmt else _DEFAULT_FORMAT.max_payload_bytes
        size = row.get("envelope_bytes") or 0
        if row["op"] != "offer" or size <= limit:
            return None
        return f"InvalidTaskError: the task is {size} bytes, over max_payload_bytes ({limit})"

    async def _offer_run(
        self,
        queue: AsyncDelayQueue,
        run: list[Claimed],
        done: list[int],
        dead: list[tuple[int, str]],
    ) -> None:
        try:
            statuses = await self._receipts.offer(queue, DedupMode(run[0].dedup), run)
        except (ServerError, InvalidTaskError) as exc:
            if len(run) > 1:
                for item in run:  # find the row refused; the others go through
                    await self._offer_run(queue, [item], done, dead)
            elif isinstance(exc, InvalidTaskError):  # refused as DelayQueue.offer refuses it
                dead.append((run[0].seq, f"{type(exc).__name__}: {exc}"))
            else:
                await self._blame_row(queue, run[0], dead, exc)
            return
        for item, status in zip(run, statuses, strict=True):
            if status == CONFLICT:
                # As DelayQueue.offer would (TaskIdConflict): the task holding the producer's
                # chosen id is kept, and the row goes dead to be seen.
                dead.append((item.seq, f"TaskIdConflict: {_CONFLICT}"))
                continue
            done.append(item.seq)
            if status == APPLIED_BEFORE:
                self.stats.duplicates += 1
            else:
                self.stats.offered += 1

    async def _apply_one(
        self,
        queue: AsyncDelayQueue,
        item: Claimed,
        done: list[int],
        dead: list[tuple[int, str]],
    ) -> None:
        try:
            if item.op == "cancel":
                outcome = await self._receipts.cancel(queue, item)
            else:
                outcome = await self._receipts.reschedule(queue, item)
        except ServerError as exc:
            await self._blame_row(queue, item, dead, exc)
            return
        except InvalidTaskError as exc:
            dead.append((item.seq, f"{type(exc).__name__}: {exc}"))
            return
        if outcome is Outcome.MISSING and not item.dropped:
            # Never reported as applied: the row stays as 'missed' (outbox status shows it),
            # counted apart and logged (the task was delivered, cancelled or never existed).
            self._missed.append(item.seq)
            self.stats.missing += 1
            log.info(
                "outbox relay: %s of task %s in %s found no waiting task",
                item.op, item.task_id, printable(queue.name),
            )  # fmt: skip
            return
        done.append(item.seq)
        if outcome is Outcome.DUPLICATE:
            self.stats.duplicates += 1
        elif item.op == "cancel":  # a dropped offer counts: it never reached Redis
            self.stats.cancelled += 1
        else:
            self.stats.rescheduled += 1

    async def _blame_row(
        self,
        queue: AsyncDelayQueue,
        item: Claimed,
        dead: list[tuple[int, str]],
        error: ServerError,
    ) -> None:
        """Redis refused one row: if the refusal speaks of the server (OOM, BUSY, ...) or the
        queue answers nothing else either, Redis is at fault (raise, and the batch waits);
        if not, the row is (dead). A read alone cannot tell: reads go through at maxmemory."""
        if refused_for_now(error):
            raise RedisUnavailable(f"Redis refuses writes to {queue.name!r}: {error}") from error
        try:
            await queue.stats()
        except DelayqError as probe:
            raise RedisUnavailable(f"Redis refuses the queue {queue.name!r}: {probe}") from probe
        dead.append((item.seq, f"Redis refused the {item.op}: {error}"))
