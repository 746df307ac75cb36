"""A private PostgreSQL database for one run: created on entry, dropped on exit."""

from __future__ import annotations

import os
import uuid
from types import TracebackType
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict


def server_dsn() -> str:
    """The server to create databases on: ``$PG_ADMIN_DSN``, else the local one."""
    return os.environ.get("PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


class TempDatabase:
    """``with TempDatabase("order_service") as dsn:`` a database named ``order_service_<hex>``
    on :func:`server_dsn`'s server, dropped afterwards (sessions still on it are ended)."""

    def __init__(self, stem: str, admin_dsn: str | None = None) -> None:
        self.admin_dsn = admin_dsn or server_dsn()
        self.name = f"{stem}_{uuid.uuid4().hex[:10]}"
        params = conninfo_to_dict(self.admin_dsn)
        params["dbname"] = self.name
        self.dsn = "postgresql://" + _url_part(params)

    def create(self) -> str:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self.dsn

    def drop(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )

    def __enter__(self) -> str:
        return self.create()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drop()


def _url_part(params: dict[str, object]) -> str:
    user = quote(str(params.get("user") or ""), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or 5432
    return f"{auth}{host}:{port}/{params['dbname']}"
