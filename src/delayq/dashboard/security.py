"""Who may see and act: the bind check, tokens, sessions, sign-in back-off and CSRF.

Everything here is per process and in memory: restarting the dashboard signs everybody out.
Nothing a client sends is adopted as a credential: session ids and CSRF cookies are issued by
the server (random, and the CSRF cookie signed with a key drawn at start), and every POST must
also come from the dashboard's own origin (scheme, host and port).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from ..exceptions import ConfigError

log = logging.getLogger(__name__)

SESSION_COOKIE = "delayq_session"
CSRF_COOKIE = "delayq_csrf"
CSRF_FIELD = "csrf"
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every address."""
    return host in _WILDCARDS


def check_token(token: str | None) -> None:
    """Refuse a token a client could guess: at least :data:`MIN_TOKEN_LENGTH` characters."""
    if token is None:
        return
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        got = len(token) if isinstance(token, str) else type(token).__name__
        raise ConfigError(
            f"the dashboard token must be at least {MIN_TOKEN_LENGTH} characters (got {got}); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    if token != token.strip():
        raise ConfigError("the dashboard token must not start or end with whitespace")


def check_bind(host: str, token: str | None, allowed_hosts: tuple[str, ...] = ()) -> None:
    """Refuse to listen beyond this machine without a token (the dashboard can cancel and
    purge tasks, and shows their payloads), and on every address without the names clients
    will use (only loopback names would be answered)."""
    if is_loopback(host):
        return
    if not token:
        raise ConfigError(
            f"refusing to listen on {host} without a token: pass --token or set "
            "DELAYQ_DASHBOARD_TOKEN (or bind 127.0.0.1)"
        )
    if is_wildcard(host) and not allowed_hosts:
        raise ConfigError(
            f"listening on {host or 'every address'} needs the names clients use in the "
            "Host header: pass --allowed-host (e.g. --allowed-host queues.internal "
            "--allowed-host 10.0.0.5); only loopback names would be served"
        )


def check_allowed_hosts(names: object) -> None:
    """Host names as clients send them: ``queues.example.com``, ``10.0.0.5`` or
    ``*.example.com`` (its subdomains); not ``*``, which would turn the check off."""
    if isinstance(names, str) or not isinstance(names, tuple | list):
        raise ConfigError(f"allowed hosts must be a tuple of names, got {names!r}")
    for name in names:
        wildcard = isinstance(name, str) and name.startswith("*.")
        if (
            not isinstance(name, str)
            or not name
            or not name.isprintable()
            or any(c in name for c in " /:@")
            or "*" in (name[2:] if wildcard else name)
        ):
            raise ConfigError(
                f"not a host name: {name!r} (use a name or address clients use, without a "
                "port, or *.example.com for its subdomains; '*' alone is refused: it would "
                "let a DNS-rebinding page in)"
            )


def host_allow_list(allowed_hosts: tuple[str, ...] | None) -> list[str]:
    """The Host names served: loopback names plus the configured ones. Applies with a token
    too: a DNS-rebinding page sends its own name, and would otherwise guess the token from a
    victim's browser as if it were the dashboard's own page."""
    return list(dict.fromkeys([*LOOPBACK_NAMES, *(allowed_hosts or ())]))


# -- origins ---------------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, host: str | None, port: int | None) -> str | None:
    if not scheme or not host:
        return None
    scheme = scheme.lower()
    port = port if port is not None else _DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{host.lower()}:{port}"


def origin_of(url: str) -> str | None:
    """``scheme://host:port`` of a URL (default ports made explicit), or None."""
    try:
        parts = urlsplit(url)
        return _origin(parts.scheme, parts.hostname, parts.port)
    except ValueError:
        return None


def own_origin(request: Request) -> str | None:
    """The origin this request was addressed to: its scheme (as uvicorn saw it, trusted proxy
    headers included) and its ``Host`` header (checked against the allow-list already)."""
    host = request.headers.get("host", "")
    return origin_of(f"{request.url.scheme}://{host}/") if host else None


def origin_problem(request: Request) -> str | None:
    """Why this POST does not come from the dashboard's own pages, or None if it does.

    Browsers send ``Origin`` on every POST; ``Sec-Fetch-Site`` and ``Referer`` are the
    fall-backs. Same-site is not enough: cookies ignore ports, so a page on another port of
    the same host is same-site, yet a different origin."""
    own = own_origin(request)
    origin = request.headers.get("origin")
    if origin is not None:
        if own is not None and origin_of(origin) == own:
            return None
        return f"the request came from {origin[:100]!r}, not from this dashboard ({own})"
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"the request came from a {site[:40]} page"
    referer = request.headers.get("referer")
    if referer:
        if own is not None and origin_of(referer) == own:
            return None
        return "the request's Referer names another origin"
    return "the request names no origin (Origin, Sec-Fetch-Site or Referer)"


# -- sessions, CSRF ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Session:
    created: float
    seen: float


class Sessions:
    """Signed-in browsers: random ids known to this process only. Logout forgets one; an id
    idle for ``idle_s`` or older than ``max_age_s`` is no longer valid; at most
    ``max_sessions`` are kept (the least recently used is dropped first)."""

    def __init__(
        self,
        *,
        idle_s: float = 12 * 3600.0,
        max_age_s: float = 7 * 86400.0,
        max_sessions: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s, self.max_age_s, self.max_sessions = idle_s, max_age_s, max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def open(self) -> str:
        now = self.clock()
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = _Session(now, now)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return sid

    def valid(self, sid: str | None) -> bool:
        """Whether ``sid`` is a live session (and mark it used)."""
        if not sid:
            return False
        session = self._sessions.get(sid)
        if session is None:
            return False
        now = self.clock()
        if now - session.seen > self.idle_s or now - session.created > self.max_age_s:
            del self._sessions[sid]
            return False
        session.seen = now
        self._sessions.move_to_end(sid)
        return True

    def close(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)

    def __len__(self) -> int:
        return len(self._sessions)


class CsrfSigner:
    """CSRF cookies the server issues and the form tokens bound to them.

    The cookie is ``nonce.signature`` under a key drawn at start, so a cookie another page
    planted (cookies ignore ports: any page on this host can set one) is not adopted. The
    form token is a MAC of the cookie's nonce and the session id, so it is only good for the
    browser it was rendered for, in the session it was rendered in."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, *parts: str) -> str:
        message = "\x00".join(parts).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:43]

    def new_cookie(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._mac('cookie', nonce)}"

    def nonce(self, cookie: str | None) -> str | None:
        """The nonce of a cookie this process issued, or None (absent, invented, or from an
        earlier run of the dashboard)."""
        if not cookie or cookie.count(".") != 1:
            return None
        nonce, signature = cookie.split(".")
        if hmac.compare_digest(signature.encode(), self._mac("cookie", nonce).encode()):
            return nonce
        return None

    def form_token(self, nonce: str, session: str | None) -> str:
        return self._mac("form", nonce, session or "")

    def form_ok(self, nonce: str | None, session: str | None, submitted: object) -> bool:
        if nonce is None or not isinstance(submitted, str):
            return False
        expected = self.form_token(nonce, session)
        return hmac.compare_digest(submitted.encode("utf-8", "replace"), expected.encode())


# -- bounded guessing ------------------------------------------------------------------------


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    locked_until: float


class SignInThrottle:
    """Failed token attempts (bearer or form) per client address: ``free`` failures are let
    through, then each further failure locks the client out for twice as long as the one
    before (``base_s``, doubling, up to ``max_s``). A client with no failure for ``forget_s``
    starts afresh; at most ``max_clients`` are remembered (the oldest forgotten first)."""

    def __init__(
        self,
        *,
        free: int = 5,
        base_s: float = 1.0,
        max_s: float = 300.0,
        forget_s: float = 900.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free, self.base_s, self.max_s = free, base_s, max_s
        self.forget_s, self.max_clients, self.clock = forget_s, max_clients, clock
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def retry_after(self, client: str) -> float:
        """Seconds until ``client`` may try a token again (0: now)."""
        entry = self._clients.get(client)
        if entry is None:
            return 0.0
        now = self.clock()
        if now - entry.last > self.forget_s and now >= entry.locked_until:
            del self._clients[client]
            return 0.0
        return max(0.0, entry.locked_until - now)

    def failed(self, client: str) -> None:
        now = self.clock()
        entry = self._clients.pop(client, None)
        if entry is None or now - entry.last > self.forget_s:
            entry = _Failures(0, now, now)
        entry.count += 1
        entry.last = now
        if entry.count > self.free:
            wait = min(self.max_s, self.base_s * 2 ** (entry.count - self.free - 1))
            entry.locked_until = now + wait
            log.warning(
                "dashboard: %d failed sign-in attempts from %s; locked out for %.0f s",
                entry.count, client, wait,
            )  # fmt: skip
        self._clients[client] = entry
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)


def token_matches(given: object, token: str) -> bool:
    if not isinstance(given, str):
        return False
    return secrets.compare_digest(given.encode("utf-8", "replace"), token.encode())


def bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if the request has one."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, given = header.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def safe_next(path: object) -> str:
    """A redirect target after login: a local path only (never ``//host`` or a URL)."""
    if (
        isinstance(path, str)
        and path.startswith("/")
        and not path.startswith(("//", "/\\"))
        and path.isprintable()
    ):
        return path
    return "/"
