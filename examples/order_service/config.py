"""The service's settings, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Settings:
    dsn: str  # libpq URL of the service's database (orders and the outbox table)
    redis_url: str
    prefix: str = "dq"  # delayq key prefix
    background: bool = True  # run the relay and the close worker in the app's lifespan
    worker_concurrency: int = 64
    pool_size: int = 10

    @classmethod
    def from_env(cls) -> Settings:
        dsn = os.environ.get("ORDER_SERVICE_DSN") or os.environ.get("DATABASE_URL")
        if not dsn:
            raise RuntimeError("set ORDER_SERVICE_DSN to the service's postgresql:// URL")
        return cls(
            dsn=dsn,
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            prefix=os.environ.get("DELAYQ_PREFIX", "dq"),
            background=os.environ.get("ORDER_SERVICE_BACKGROUND", "1") != "0",
            worker_concurrency=int(os.environ.get("ORDER_SERVICE_CONCURRENCY", "64")),
            pool_size=int(os.environ.get("ORDER_SERVICE_POOL_SIZE", "10")),
        )
