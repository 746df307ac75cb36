"""The outbox table and every statement run on it: pure text, shared by both front ends.

One row is one operation on one task, in commit order by ``seq``:

- ``offer``: ``envelope``, ``options`` and ``dedup`` are the encoded task, exactly what the
  queue's offer script takes; ``due_kind`` is ``'d'`` (``due_ms`` = a delay counted from
  ``created``) or ``'a'`` (``due_ms`` = epoch ms).
- ``cancel``: no other column is used.
- ``reschedule``: ``due_kind`` and ``due_ms`` as for an offer.

Every row has its own ``apply_id`` (a UUID the database draws): the script that applies the
row records it in the queue's hash tag and refuses it afterwards, so a row applied and then
claimed again (its DELETE failed, its relay died before the commit) changes nothing.

``created`` is the database's ``clock_timestamp()`` at the insert. The relay turns a relative
delay into what is left of it with the same server's clock at relay time, so the due time is
the offer's time plus its delay however late the relay runs, and no host's own clock decides.

Statements use ``:name`` parameters (SQLAlchemy's ``text()`` style); :func:`for_psycopg`
rewrites them for psycopg. No statement contains ``%`` or a ``::`` cast.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .._core.keys import check_prefix, validate_name
from ..exceptions import ConfigError

_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,50}")
_PARAM: Final = re.compile(r"(?<![:\w]):([a-z_]\w*)")
# Rows a relay claims per transaction by default: one offer script call per queue per batch.
DEFAULT_BATCH: Final = 500
# And at most this many bytes of envelopes and options per batch (one larger row goes alone).
DEFAULT_BATCH_BYTES: Final = 4 << 20
OPS: Final = ("offer", "cancel", "reschedule")
_LONGEST_CHANNEL: Final = 63  # PostgreSQL's NAMEDATALEN - 1: a longer channel name fails


def _scope(prefixes: Sequence[str], queues: Sequence[str]) -> str:
    """The claim's filter for a relay scoped to some prefixes and queues. Names are
    literals here: each was checked against the key-name rules (no quote can pass)."""
    parts = []
    for column, names, check in (("prefix", prefixes, check_prefix), ("queue", queues, None)):
        if names:
            checked = [check(n) if check else validate_name(n) for n in names]
            listed = ", ".join(f"'{n}'" for n in checked)
            parts.append(f"AND o.{column} IN ({listed}) ")
    return "".join(parts)


def for_psycopg(sql: str) -> str:
    """``:name`` parameters as psycopg's ``%(name)s``."""
    return _PARAM.sub(r"%(\1)s", sql)


def _ident(value: object, what: str) -> str:
    if not isinstance(value, str) or not _IDENT.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} must be 1-51 characters from A-Z a-z 0-9 _, not starting with a "
            "digit (it names database objects)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Schema:
    """The names of the outbox's database objects and the statements that use them."""

    table: str = "delayq_outbox"
    schema: str | None = None

    def __post_init__(self) -> None:
        _ident(self.table, "table")
        if self.schema is not None:
            _ident(self.schema, "schema")
            if self.schema.lower() == "information_schema" or self.schema.lower().startswith("pg_"):
                raise ConfigError(
                    f"schema {self.schema!r} is PostgreSQL's own: choose a schema of yours"
                )
        if len(self.channel) > _LONGEST_CHANNEL:
            raise ConfigError(
                f"schema and table name the NOTIFY channel {self.channel!r}, "
                f"{len(self.channel)} characters: PostgreSQL allows {_LONGEST_CHANNEL} "
                "(shorten either)"
            )

    @property
    def qualified(self) -> str:
        """The table's name as SQL (identifiers were validated, so quoting is enough)."""
        return f'"{self.schema}"."{self.table}"' if self.schema else f'"{self.table}"'

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel a commit of new rows wakes the relays on."""
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def listen(self) -> str:
        return f'LISTEN "{self.channel}"'

    def _obj(self, suffix: str) -> str:
        name = f"{self.table}_{suffix}"
        return f'"{self.schema}"."{name}"' if self.schema else f'"{name}"'

    def install(self) -> list[str]:
        """DDL, each statement idempotent; run in one transaction under an advisory lock so
        that two installers at once do not trip over each other."""
        t, notify = self.qualified, self._obj("notify")
        create_schema = [f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'] if self.schema else []
        return [
            f"SELECT pg_advisory_xact_lock(hashtext('delayq.outbox/{self.channel}'))",
            *create_schema,
            f"""CREATE TABLE IF NOT EXISTS {t} (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                prefix text NOT NULL,
                queue text NOT NULL,
                task_id text NOT NULL,
                op text NOT NULL CHECK (op IN ('offer', 'cancel', 'reschedule')),
                due_kind text,
                due_ms bigint,
                envelope bytea,
                options text NOT NULL DEFAULT '',
                dedup text NOT NULL DEFAULT 'keep',
                created timestamptz NOT NULL DEFAULT clock_timestamp(),
                status text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'dead', 'missed')),
                error text,
                apply_id uuid NOT NULL DEFAULT gen_random_uuid()
            )""",
            # A table installed before apply ids: add them (each existing row gets its own).
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS apply_id uuid NOT NULL "
            "DEFAULT gen_random_uuid()",
            # 'missed': a cancel or reschedule that found no waiting task, kept to be seen.
            # A table installed before it has the older check (under a name PostgreSQL chose).
            f"""DO $$ DECLARE c text; BEGIN
                FOR c IN SELECT conname FROM pg_constraint
                    WHERE conrelid = CAST('{t}' AS regclass) AND contype = 'c'
                    AND position('status' in pg_get_constraintdef(oid)) > 0
                    AND position('missed' in pg_get_constraintdef(oid)) = 0 LOOP
                    EXECUTE 'ALTER TABLE {t} DROP CONSTRAINT ' || quote_ident(c);
                    EXECUTE 'ALTER TABLE {t} ADD CHECK '
                        || '(status IN (''pending'', ''dead'', ''missed''))';
                END LOOP;
            END $$""",
            # The relay's claim walks pending rows in seq order, and looks up earlier rows of
            # the same task: both indexes hold pending rows only, so they stay small.
            f'CREATE INDEX IF NOT EXISTS "{self.table}_pending" ON {t} (seq) '
            "WHERE status = 'pending'",
            f'CREATE INDEX IF NOT EXISTS "{self.table}_task" ON {t} (queue, task_id, seq) '
            "WHERE status = 'pending'",
            # One NOTIFY per inserting statement, delivered at commit and never for a rolled
            # back transaction or savepoint: the relays' wake-up.
            f"""CREATE OR REPLACE FUNCTION {notify}() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM pg_notify('{self.channel}', '');
                    RETURN NULL;
                END $$""",
            f'DROP TRIGGER IF EXISTS "{self.table}_notify" ON {t}',
            f'CREATE TRIGGER "{self.table}_notify" AFTER INSERT ON {t} '
            f"FOR EACH STATEMENT EXECUTE FUNCTION {notify}()",
        ]

    @property
    def insert(self) -> str:
        return (
            f"INSERT INTO {self.qualified} "
            "(prefix, queue, task_id, op, due_kind, due_ms, envelope, options, dedup) VALUES "
            "(:prefix, :queue, :task_id, :op, :due_kind, :due_ms, :envelope, :options, :dedup)"
        )

    @property
    def cancel(self) -> str:
        """A cancel row; first drops the task's rows no relay holds right now (an offer not
        relayed yet never reaches Redis). The cancel row is written anyway: a dropped row may
        have been offered by a relay that died before its commit. Its ``options`` say
        ``dropped`` if it dropped the task's offer (or a cancel that had): then finding no
        task in Redis is what is expected, not a missed cancel. Dropping a reschedule alone
        says nothing of the task."""
        t = self.qualified
        return (
            f"WITH dropped AS (DELETE FROM {t} WHERE seq IN ("
            f"SELECT seq FROM {t} WHERE queue = :queue AND task_id = :task_id "
            "AND prefix = :prefix AND status = 'pending' FOR UPDATE SKIP LOCKED) "
            "RETURNING op, options) "
            f"INSERT INTO {t} (prefix, queue, task_id, op, options) "
            "SELECT :prefix, :queue, :task_id, 'cancel', CASE WHEN EXISTS (SELECT 1 FROM dropped "
            "WHERE op = 'offer' OR (op = 'cancel' AND options = 'dropped')) "
            "THEN 'dropped' ELSE '' END"
        )

    def claim(
        self,
        max_row_bytes: int = 1 << 20,
        prefixes: Sequence[str] = (),
        queues: Sequence[str] = (),
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> str:
        """The pending rows no other relay holds, in ``seq`` order, each the earliest pending
        row of its task (so a task's rows are applied in order, whichever relays run), locked
        until the claiming transaction ends. ``due_ms`` of a relative row comes back as what
        is left of its delay on the database's clock (a negative one as it is, to be refused).

        Bounded in bytes: ``in_batch`` is true for the rows whose envelopes and options, summed
        in ``seq`` order, stay within ``batch_bytes`` (and for the first row, whatever its
        size: it goes alone); the rows after them come back without their envelope and options
        (a few dozen bytes each), and the relay leaves them pending for its next batch. So a
        batch never brings more than ``batch_bytes`` (or one row) of payloads into the relay's
        memory, however many rows it counts. A row over ``max_row_bytes`` is not read at all
        (it goes dead by its size) and counts nothing.

        Run as a cursor and FETCHed a batch at a time: a cursor is planned for its first rows
        (an index walk in ``seq`` order, one index probe per row for the earlier-row check,
        stopping at the batch), whatever the statistics say. A queue table's statistics are
        always stale (empty one minute, 50,000 rows the next); planned with them, a plain
        ``LIMIT`` sorted the whole backlog for every batch. The running sum is a window over
        the locked rows in the order they come (a ``ROWS`` frame with no ``ORDER BY``: an
        ``ORDER BY seq`` there made the planner sort, and so lock, the whole backlog), so the
        walk still stops at the batch (the window reads, and locks, one row beyond it).
        """
        t = self.qualified
        readable = f"octet_length(o.envelope) <= {int(max_row_bytes)}"
        locked = (
            "SELECT o.seq, o.prefix, o.queue, o.task_id, o.op, o.due_kind, "
            "CASE WHEN o.due_kind = 'd' AND o.due_ms >= 0 THEN GREATEST(0, o.due_ms - CAST(floor("
            "extract(epoch FROM clock_timestamp() - o.created) * 1000) AS bigint)) "
            "ELSE o.due_ms END AS due_ms, "
            # A row over the relay's largest max_payload_bytes is not even read (it goes dead
            # by its size).
            f"CASE WHEN {readable} THEN o.envelope END AS envelope, "
            "octet_length(o.envelope) AS envelope_bytes, o.options, "
            f"CASE WHEN {readable} THEN octet_length(o.envelope) ELSE 0 END "
            "+ octet_length(o.options) AS read_bytes, "
            "o.dedup, CAST(o.apply_id AS text) AS apply_id, "
            "CAST(extract(epoch FROM clock_timestamp() - o.created) AS float8) AS age_s "
            f"FROM {t} o WHERE o.status = 'pending' {_scope(prefixes, queues)}AND o.seq = ("
            f"SELECT p.seq FROM {t} p WHERE p.queue = o.queue AND p.task_id = o.task_id "
            "AND p.status = 'pending' AND p.prefix = o.prefix ORDER BY p.seq LIMIT 1) "
            "ORDER BY o.seq FOR UPDATE OF o SKIP LOCKED"
        )
        counted = (
            f"SELECT r.*, (sum(r.read_bytes) OVER w <= {int(batch_bytes)} "
            "OR row_number() OVER w = 1) AS in_batch "
            f"FROM ({locked}) r WINDOW w AS (ROWS UNBOUNDED PRECEDING)"
        )
        return (
            "SELECT c.seq, c.prefix, c.queue, c.task_id, c.op, c.due_kind, c.due_ms, "
            "CASE WHEN c.in_batch THEN c.envelope END AS envelope, c.envelope_bytes, "
            "CASE WHEN c.in_batch THEN c.options END AS options, c.dedup, "
            f"c.apply_id, c.age_s, c.in_batch FROM ({counted}) c"
        )

    def claim_batch(
        self,
        batch: int,
        max_row_bytes: int = 1 << 20,
        prefixes: Sequence[str] = (),
        queues: Sequence[str] = (),
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> str:
        """BEGIN, then :meth:`claim` as a cursor and its first ``batch`` rows: one round trip
        (simple query protocol, no parameters: ``batch``, ``max_row_bytes`` and
        ``batch_bytes`` are ints, the scope's names were checked by :func:`_scope`)."""
        claim = self.claim(max_row_bytes, prefixes, queues, batch_bytes)
        return (
            f"BEGIN; DECLARE delayq_claim NO SCROLL CURSOR FOR {claim}; "
            f"FETCH FORWARD {int(batch)} FROM delayq_claim"
        )

    def finish_claim(self, seqs: Sequence[int], missed: Sequence[int] = ()) -> str:
        """Delete the relayed rows, keep the ``missed`` ones (a cancel or reschedule that
        found no waiting task) as such, and commit, in one round trip (``seqs`` are ints)."""
        statements = []
        if seqs:
            listed = ", ".join(str(int(seq)) for seq in seqs)
            statements.append(f"DELETE FROM {self.qualified} WHERE seq IN ({listed})")
        if missed:
            listed = ", ".join(str(int(seq)) for seq in missed)
            statements.append(
                f"UPDATE {self.qualified} SET status = 'missed', error = 'found no waiting "
                f"task' WHERE seq IN ({listed})"
            )
        return "; ".join([*statements, "COMMIT"])

    @property
    def bury(self) -> str:
        return f"UPDATE {self.qualified} SET status = 'dead', error = :error WHERE seq = :seq"

    @property
    def status(self) -> str:
        """Counts per queue and state, with the age of the oldest row."""
        return (
            "SELECT prefix, queue, status, count(*) AS n, "
            "CAST(extract(epoch FROM clock_timestamp() - min(created)) AS float8) AS oldest_s "
            f"FROM {self.qualified} GROUP BY prefix, queue, status ORDER BY prefix, queue, status"
        )

    @property
    def dead(self) -> str:
        return (
            "SELECT seq, prefix, queue, task_id, op, created, error "
            f"FROM {self.qualified} WHERE status = :status ORDER BY seq LIMIT :limit"
        )

    @property
    def purge(self) -> str:
        """Delete rows of one status ('dead' or 'missed'), oldest first, a bounded batch at a
        time (each statement stays short on a large table)."""
        t = self.qualified
        return (
            f"DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE status = :status "
            "ORDER BY seq LIMIT :limit)"
        )

    @property
    def requeue_dead(self) -> str:
        """Dead rows pending again, but an offer its task's later cancel row stands against
        (the cancel found no task): offer, then cancel, ends with no task."""
        t = self.qualified
        return (
            f"UPDATE {t} AS d SET status = 'pending', error = NULL WHERE status = 'dead' "
            f"AND NOT (op = 'offer' AND EXISTS (SELECT 1 FROM {t} c WHERE c.prefix = d.prefix "
            "AND c.queue = d.queue AND c.task_id = d.task_id AND c.op = 'cancel' "
            "AND c.seq > d.seq))"
        )

    @property
    def exists(self) -> str:
        return "SELECT to_regclass(:name) IS NOT NULL"
