"""Redis URLs in messages: never show a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def safe_url(url: str) -> str:
    """``url`` with its password masked, for messages and pages."""
    try:
        parts = urlsplit(url)
        if parts.password:
            host = parts.netloc.rpartition("@")[2]
            user = parts.username or ""
            return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        pass
    return url
