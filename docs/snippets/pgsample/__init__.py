"""A PostgreSQL database of the sample's own, dropped when the sample exits: the samples never
touch an existing database. ``PG_ADMIN_DSN`` names the server (default: the local one)."""

import atexit
import os
import uuid

import psycopg
from psycopg.conninfo import conninfo_to_dict


def temp_database() -> str:
    """Create ``delayq_sample_<hex>`` and return its ``postgresql://`` URL."""
    server = os.environ.get("PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"delayq_sample_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    @atexit.register
    def drop() -> None:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    params = conninfo_to_dict(server)
    user = params.get("user", "postgres")
    return (
        f"postgresql://{user}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{name}"
    )
