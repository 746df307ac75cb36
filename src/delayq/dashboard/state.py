"""The dashboard's state: what every endpoint needs, built once by ``create_app`` and kept on
``app.state.dashboard`` (the settings, the Redis monitor, the history behind the charts, the
sign-in and CSRF machinery, the templates)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.templating import Jinja2Templates

from .._core.text import utf8_safe
from .._core.timing import Duration, duration_ms
from ..exceptions import ConfigError
from . import security, views
from .monitor import Monitor, Snapshot
from .series import History, sample_of

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
SAMPLER_CHUNK = 200  # queues per round of the sampler (pages are served between rounds)
STALE_SUMMARY_S = 60.0  # the main page's summary of all queues is never older than this


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``delayq dashboard`` can be told."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "dq"
    token: str | None = None  # at least 16 characters (ConfigError otherwise)
    read_only: bool = False
    sample_interval_s: float = 5.0  # how often the sampler records every queue's stats
    window_s: float = 3600.0  # history kept for the charts (in memory)
    bin_s: float = 60.0  # one chart point per bin
    refresh_s: float = 5.0  # the pages reload their figures this often (0: never)
    reconnect_timeout: Duration = 2.0  # how long a page waits for an unreachable Redis
    # Host header names served besides the loopback ones, token or not: without the check a
    # web page could rebind its own name to this address (DNS rebinding), then read the
    # dashboard and post its forms, or guess the token, from a victim's browser.
    allowed_hosts: tuple[str, ...] = ()
    history_queues: int = 200  # queues with charts of their own (the total covers all)
    # A PostgreSQL outbox whose health the main page shows (the postgres extra).
    outbox_dsn: str | None = None
    outbox_table: str = "delayq_outbox"
    outbox_schema: str | None = None

    def __post_init__(self) -> None:
        security.check_token(self.token)
        security.check_allowed_hosts(self.allowed_hosts)
        for name in ("sample_interval_s", "window_s", "bin_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        try:  # seconds or a timedelta, as everywhere a retry budget is taken
            duration_ms(self.reconnect_timeout, "reconnect_timeout", allow_zero=False)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if not isinstance(self.history_queues, int) or self.history_queues < 0:
            raise ConfigError(f"history_queues must be an int >= 0, got {self.history_queues!r}")


def load_templates() -> Jinja2Templates:
    """The pages' templates, with the formatting filters of :mod:`.views`."""
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        # Every value printed is made encodable: a lone surrogate from Redis (from a JSON
        # escape another producer wrote) would make the response's UTF-8 encoding raise.
        finalize=lambda value: utf8_safe(value) if isinstance(value, str) else value,
    )
    env.filters.update(
        ago=views.ago, block=views.block, duration=views.duration, error_line=views.error_line,
        exact=views.exact, header_rows=views.header_rows, iso=views.iso, pretty=views.pretty,
        preview=views.preview, q=views.quote_all, relative=views.relative, text=views.text,
    )  # fmt: skip
    return Jinja2Templates(env=env)


class Dashboard:
    """The state behind the app (``request.app.state.dashboard``): the Redis monitor, the
    history, who is signed in, and the templates."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.monitor = Monitor(
            settings.redis_url, settings.prefix, reconnect_timeout=settings.reconnect_timeout
        )
        self.history = History(
            settings.window_s, settings.sample_interval_s, settings.history_queues
        )
        self.sessions = security.Sessions()
        self.signer = security.CsrfSigner()
        self.throttle = security.SignInThrottle()
        self.templates = load_templates()
        self.sampler_error: str | None = None
        self._summary: tuple[float, Snapshot] | None = None
        self._summary_lock = asyncio.Lock()
        self._refreshing = False

    async def sample_once(self) -> None:
        """Record one sample of every registered queue."""
        snapshot = await self.monitor.snapshot(chunk=SAMPLER_CHUNK)
        self._summary = (time.monotonic(), snapshot)
        t = time.time()
        self.history.record({s.queue: sample_of(s, t) for s in snapshot.stats}, t)

    async def summary(self, names: list[str]) -> tuple[Snapshot, bool, bool]:
        """Every registered queue's stats, and whether they were read just now, and whether
        they are stale. The sampler's latest round while it is at most one sampling interval
        old; an older one (up to :data:`STALE_SUMMARY_S`: no sampler runs, as when the app is
        mounted without its lifespan) is used too, stale: the page then refreshes it after its
        response (:meth:`refresh_summary`), so that only the first page waits for all queues.
        Read once for concurrent pages; a page never waits for a refresh in the background."""
        kept = self._kept_summary()
        if kept is not None:
            return kept
        async with self._summary_lock:
            kept = self._kept_summary()  # read by the page this one waited for
            if kept is not None:
                return kept
            snapshot = await self.monitor.snapshot(names)
            self._summary = (time.monotonic(), snapshot)
            return snapshot, True, False

    def _kept_summary(self) -> tuple[Snapshot, bool, bool] | None:
        if self._summary is None:
            return None
        taken, snapshot = self._summary
        age = time.monotonic() - taken
        if age <= self.settings.sample_interval_s:
            return snapshot, False, False
        if age <= STALE_SUMMARY_S:
            return snapshot, False, True
        return None

    async def refresh_summary(self) -> None:
        """Read every queue's stats again (after a page that showed stale ones)."""
        if self._refreshing:  # another page's refresh is at it
            return
        self._refreshing = True
        try:
            snapshot = await self.monitor.snapshot(chunk=SAMPLER_CHUNK)
            self._summary = (time.monotonic(), snapshot)
        except Exception as exc:  # the next page reads them itself, or says Redis is down
            log.warning("dashboard: reading the queues failed: %s", views.masked(exc))
        finally:
            self._refreshing = False

    def summary_age(self) -> float:
        return 0.0 if self._summary is None else time.monotonic() - self._summary[0]

    async def run_sampler(self) -> None:
        while True:
            try:
                await self.sample_once()
                self.sampler_error = None
            except Exception as exc:  # keep sampling through outages; the pages say so
                self.sampler_error = f"{type(exc).__name__}: {views.masked(exc)}"
                log.warning("dashboard: sampling failed: %s", views.masked(exc))
            await asyncio.sleep(self.settings.sample_interval_s)
