"""Running one statement on whatever connection the caller holds.

The outbox writes in the caller's transaction, so it takes the caller's own connection:
psycopg 3 (``Connection``, ``Cursor``, and their async twins) or SQLAlchemy 2 (``Session``,
``Connection``, ``AsyncSession``, ``AsyncConnection``). Both libraries are optional imports:
only the one the caller uses has to be installed.

Each helper's asyncio twin has the same name with an ``a`` in front (``aexecute``,
``aadmin``, ``acheck_target``): ``scripts/unasync.py`` maps the names of ``_async/outbox.py``
to the sync ones.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from .._core.urls import safe_url, without_secrets_of
from ..exceptions import ConfigError
from ._schema import for_psycopg

INSTALL_HINT = "pip install 'delayq[postgres]'"
_KINDS = (
    "a psycopg Connection or Cursor, or a SQLAlchemy Session or Connection "
    "(AsyncOutbox takes their async twins)"
)

Row = dict[str, Any]


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def require_psycopg() -> Any:
    """The psycopg module, or a :class:`ConfigError` naming the extra to install."""
    psycopg = _module("psycopg")
    if psycopg is None:
        raise ConfigError(f"the PostgreSQL outbox needs psycopg 3: {INSTALL_HINT}")
    return psycopg


def _sqlalchemy_text(sql: str) -> Any:
    return importlib.import_module("sqlalchemy").text(sql)


def _is_sqlalchemy_sync(conn: object) -> bool:
    orm, engine = _module("sqlalchemy.orm"), _module("sqlalchemy.engine")
    return orm is not None and isinstance(conn, orm.Session | engine.Connection)


def _is_sqlalchemy_async(conn: object) -> bool:
    ext = _module("sqlalchemy.ext.asyncio")
    return ext is not None and isinstance(conn, ext.AsyncSession | ext.AsyncConnection)


def execute(conn: Any, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    """Run ``sql`` on a sync connection in its current transaction; the rows, if any."""
    psycopg = _module("psycopg")
    if psycopg is not None and isinstance(conn, psycopg.Connection | psycopg.Cursor):
        cur = conn.execute(for_psycopg(sql), params)
        if cur.description is None:
            return []
        names = [c.name for c in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    if _is_sqlalchemy_sync(conn):
        result = conn.execute(_sqlalchemy_text(sql), dict(params or {}))
        return [dict(row) for row in result.mappings().all()] if result.returns_rows else []
    if _is_sqlalchemy_async(conn) or (
        psycopg is not None and isinstance(conn, psycopg.AsyncConnection | psycopg.AsyncCursor)
    ):
        raise ConfigError(f"{type(conn).__name__} is async: use AsyncOutbox")
    raise ConfigError(f"conn must be {_KINDS}, not {type(conn).__name__}")


async def aexecute(conn: Any, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    """:func:`execute` for async connections."""
    psycopg = _module("psycopg")
    if psycopg is not None and isinstance(conn, psycopg.AsyncConnection | psycopg.AsyncCursor):
        cur = await conn.execute(for_psycopg(sql), params)
        if cur.description is None:
            return []
        names = [c.name for c in cur.description]
        return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]
    if _is_sqlalchemy_async(conn):
        result = await conn.execute(_sqlalchemy_text(sql), dict(params or {}))
        return [dict(row) for row in result.mappings().all()] if result.returns_rows else []
    if _is_sqlalchemy_sync(conn) or (
        psycopg is not None and isinstance(conn, psycopg.Connection | psycopg.Cursor)
    ):
        raise ConfigError(f"{type(conn).__name__} is not async: use Outbox")
    raise ConfigError(f"conn must be {_KINDS}, not {type(conn).__name__}")


def check_target(target: object) -> None:
    """Refuse at construction what :func:`admin` cannot connect with."""
    _check_target(target, is_async=False)


def acheck_target(target: object) -> None:
    """Refuse at construction what :func:`aadmin` cannot connect with."""
    _check_target(target, is_async=True)


def check_dsn(dsn: str) -> None:
    """Refuse a connection string libpq cannot parse, with a message that shows no part of
    its password (psycopg quotes the token it chokes on, which may be one)."""
    psycopg = _module("psycopg")
    if psycopg is None:
        return  # the first use says to install the extra
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigError(
            f"invalid PostgreSQL DSN {safe_url(dsn)!r}: {without_secrets_of(str(exc), dsn)}"
        ) from None  # the original error quotes the DSN


def _check_target(target: object, *, is_async: bool) -> None:
    if isinstance(target, str):
        check_dsn(target)
        return
    if target is None:
        return
    pool = _module("psycopg_pool")
    sa = _module("sqlalchemy.ext.asyncio") if is_async else _module("sqlalchemy.engine")
    if is_async:
        kinds = tuple(
            k
            for k in (getattr(pool, "AsyncConnectionPool", None), getattr(sa, "AsyncEngine", None))
            if k is not None
        )
        what = "a DSN, a psycopg_pool AsyncConnectionPool or a SQLAlchemy AsyncEngine"
    else:
        kinds = tuple(
            k
            for k in (getattr(pool, "ConnectionPool", None), getattr(sa, "Engine", None))
            if k is not None
        )
        what = "a DSN, a psycopg_pool ConnectionPool or a SQLAlchemy Engine"
    if not kinds or not isinstance(target, kinds):
        raise ConfigError(f"the outbox's database must be {what}, not {type(target).__name__}")


@contextmanager
def admin(target: Any) -> Iterator[Any]:
    """A connection in a transaction (committed on success) from a DSN, pool or engine."""
    if target is None:
        raise ConfigError("this Outbox was made without a database: give it a DSN, pool or engine")
    if isinstance(target, str):
        psycopg = require_psycopg()
        with psycopg.connect(target) as conn, conn.transaction():
            yield conn
    elif hasattr(target, "begin"):  # a SQLAlchemy Engine
        with target.begin() as conn:
            yield conn
    else:  # a psycopg_pool ConnectionPool
        with target.connection() as conn, conn.transaction():
            yield conn


@asynccontextmanager
async def aadmin(target: Any) -> AsyncIterator[Any]:
    """:func:`admin` for async DSNs, pools and engines."""
    if target is None:
        raise ConfigError("this Outbox was made without a database: give it a DSN, pool or engine")
    if isinstance(target, str):
        psycopg = require_psycopg()
        async with await psycopg.AsyncConnection.connect(target) as conn, conn.transaction():
            yield conn
    elif hasattr(target, "begin"):  # a SQLAlchemy AsyncEngine
        async with target.begin() as conn:
            yield conn
    else:  # a psycopg_pool AsyncConnectionPool
        async with target.connection() as conn, conn.transaction():
            yield conn
