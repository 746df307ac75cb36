"""Django's database connection as the outbox sees it: the raw psycopg 3 connection (which
shares the transaction of ``transaction.atomic``) and a libpq connection string for the relay."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import delayq_settings

# Keys of DATABASES[...]["OPTIONS"] that Django or psycopg consume, not libpq.
_NOT_LIBPQ = frozenset(
    {"isolation_level", "pool", "server_side_binding", "assume_role", "prepare_threshold",
     "cursor_factory", "context", "autocommit"}
)  # fmt: skip


def alias_of(using: str | None) -> str:
    """``using``, or the outbox's database (``DELAYQ["DATABASE"]``)."""
    return using or delayq_settings().database


def raw_connection(using: str | None = None) -> Any:
    """The psycopg 3 connection under Django's connection ``using`` (opened if needed).

    Statements run on it are part of the current ``transaction.atomic()`` block (and of its
    savepoints); outside one, Django runs in autocommit and they commit at once.
    """
    wrapper = connections[alias_of(using)]
    check_postgresql(wrapper)
    wrapper.ensure_connection()
    raw = wrapper.connection
    if type(raw).__module__.split(".")[0] != "psycopg":
        raise ImproperlyConfigured(
            f"delayq's Django outbox needs the psycopg 3 driver; database {wrapper.alias!r} "
            f"runs on {type(raw).__module__} (pip install 'psycopg[binary]')"
        )
    return raw


def check_postgresql(wrapper: Any) -> None:
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"delayq's outbox lives in PostgreSQL; database {wrapper.alias!r} is {wrapper.vendor}"
        )


def conninfo(using: str | None = None) -> str:
    """A libpq connection string for Django's database ``using``, for the relay's own
    connections (it LISTENs, so it cannot borrow a Django connection)."""
    from psycopg.conninfo import make_conninfo

    wrapper = connections[alias_of(using)]
    check_postgresql(wrapper)
    conf = wrapper.settings_dict
    params: dict[str, Any] = {
        "dbname": conf.get("NAME") or None,
        "user": conf.get("USER") or None,
        "password": conf.get("PASSWORD") or None,
        "host": conf.get("HOST") or None,
        "port": str(conf["PORT"]) if conf.get("PORT") else None,
    }
    # libpq options (sslmode, connect_timeout, ...) pass through; Django's own keys and
    # psycopg's connection arguments are not libpq's.
    for name, value in (conf.get("OPTIONS") or {}).items():
        if isinstance(value, str | int) and name not in _NOT_LIBPQ:
            params[name] = str(value)
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})
