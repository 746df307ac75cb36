"""Who may see and act: the bind check, the token (cookie or bearer) and CSRF tokens."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from starlette.requests import Request

from ..exceptions import ConfigError

AUTH_COOKIE = "delayq_auth"
CSRF_COOKIE = "delayq_csrf"
CSRF_FIELD = "csrf"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a token: the dashboard can cancel and
    purge tasks, and shows their payloads."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to listen on {host} without a token: pass --token or set "
            "DELAYQ_DASHBOARD_TOKEN (or bind 127.0.0.1)"
        )


def session_value(token: str) -> str:
    """The auth cookie's value: derived from the token, so the cookie does not hold it."""
    return hmac.new(token.encode(), b"delayq-dashboard-session", hashlib.sha256).hexdigest()


def authorized(request: Request, token: str | None) -> bool:
    """No token configured, or the request carries it (bearer header or login cookie)."""
    if not token:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and secrets.compare_digest(
        given.strip().encode(), token.encode()
    ):
        return True
    cookie = request.cookies.get(AUTH_COOKIE, "")
    return secrets.compare_digest(cookie.encode(), session_value(token).encode())


def token_matches(given: str, token: str) -> bool:
    return secrets.compare_digest(given.encode(), token.encode())


def csrf_token(request: Request) -> tuple[str, bool]:
    """This browser's CSRF token and whether it is new (then it must be set as a cookie)."""
    current = request.cookies.get(CSRF_COOKIE, "")
    if len(current) >= 32:
        return current, False
    return secrets.token_urlsafe(32), True


def csrf_ok(request: Request, submitted: object) -> bool:
    """The form's token equals the cookie's (double submit): another site can make the browser
    post a form, but can neither read the cookie nor, SameSite=Strict, send it along."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if len(cookie) < 32 or not isinstance(submitted, str):
        return False
    return secrets.compare_digest(cookie.encode(), submitted.encode())


def safe_next(path: object) -> str:
    """A redirect target after login: a local path only (never ``//host`` or a URL)."""
    if isinstance(path, str) and path.startswith("/") and not path.startswith(("//", "/\\")):
        return path
    return "/"
