"""The connection layer's pure parts: which Redis a URL names, and what an error means.

Every Redis call of delayq (queues, workers, CLI, exporter, dashboard) goes through the
runners in ``_async/runner.py`` and ``_sync/runner.py``; what they decide without I/O lives
here: URL parsing for every accepted form, the classification of errors into "try again,
maybe elsewhere" and "give up", cluster redirections, and the backoff between tries.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import hiredis

from ..exceptions import ConfigError
from .urls import safe_url, without_secrets_of

DEFAULT_URL = "redis://127.0.0.1:6379/0"
ACCEPTED_FORMS = (
    "redis://[user:password@]host[:port][/db], rediss://… (TLS), unix:///path/to.sock[?db=N], "
    "redis+sentinel://[user:password@]host:port[,host:port…]/service_name[/db] "
    "(rediss+sentinel:// for TLS), redis+cluster://host:port[,host:port…] "
    "(rediss+cluster:// for TLS), or a redis-py client"
)


def default_url() -> str:
    """The Redis URL used when none is given: ``$REDIS_URL``, else the local default."""
    return os.environ.get("REDIS_URL") or DEFAULT_URL


class Topology(StrEnum):
    STANDALONE = "standalone"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


# How long a caller's call rides out a lost connection by default, per topology: long enough
# for a failover with the servers' default settings (Sentinel: down-after-milliseconds 30 s,
# then an election of a few seconds; Cluster: cluster-node-timeout 15 s, then the election).
DEFAULT_RECONNECT_S = {
    Topology.STANDALONE: 10.0,
    Topology.SENTINEL: 40.0,
    Topology.CLUSTER: 25.0,
}


def packed(commands: Sequence[Sequence[Any]], fallback: Callable[..., list[bytes]]) -> list[bytes]:
    """``commands`` in Redis's protocol, one buffer. hiredis packs a command in one C call;
    redis-py's packers (used through ``fallback``, a connection's ``pack_commands``) check and
    encode each argument in Python first: about a fifth of a take()/ack() loop's client time, for
    a script call's 30 arguments. What hiredis refuses (a bool, None) goes to ``fallback``,
    which raises redis-py's own error for it."""
    try:
        return [b"".join([hiredis.pack_command(tuple(command)) for command in commands])]
    except TypeError:
        return fallback(commands)


def socket_timeout_s(reconnect_s: float) -> float:
    """The socket timeout of a client made for a runner: a hung server must not outlast the
    call's own deadline, and a slow answer must not look like a dead server."""
    return min(max(reconnect_s, 0.5), 5.0)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL points. ``url`` is the redis-py URL of a standalone server (its options
    kept); sentinel and cluster targets list their seed ``hosts``."""

    topology: Topology
    url: str = ""
    hosts: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    # Options for the sentinels themselves (their own password and TLS), from the query.
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_tls: bool = False
    options: dict[str, str] = field(default_factory=dict)


_TRUE = {"1", "true", "yes", "on"}
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(\d{1,5}))?$")


def parse_url(url: object) -> Target:
    """The :class:`Target` a URL names; :class:`ConfigError` for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"a Redis URL must be a non-empty string; accepted: {ACCEPTED_FORMS}")
    shown = safe_url(url)
    scheme, sep, _rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(f"not a Redis URL: {shown!r}; accepted: {ACCEPTED_FORMS}")
    if scheme in ("redis", "rediss", "unix"):
        return _standalone(url, scheme, shown)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        return _sentinel(url, scheme.startswith("rediss"), shown)
    if scheme in ("redis+cluster", "rediss+cluster"):
        return _cluster(url, scheme.startswith("rediss"), shown)
    raise ConfigError(f"unsupported URL scheme {scheme!r} in {shown!r}; accepted: {ACCEPTED_FORMS}")


def _standalone(url: str, scheme: str, shown: str) -> Target:
    try:
        parts = urlsplit(url)
        if scheme != "unix":
            _ = parts.port  # raises ValueError on a bad port
            if not parts.hostname:
                raise ValueError("no host")
        elif not parts.path:
            raise ValueError("no socket path")
        db = _db_of(parts.path if scheme != "unix" else "", dict(parse_qsl(parts.query)))
    except ValueError as exc:
        raise ConfigError(
            f"invalid Redis URL {shown!r}: {without_secrets_of(str(exc), url)}; "
            f"accepted: {ACCEPTED_FORMS}"
        ) from None  # the parser's own error may quote part of the password
    return Target(Topology.STANDALONE, url=url, db=db, tls=scheme == "rediss")


def _db_of(path: str, query: dict[str, str]) -> int:
    text = path.strip("/") or query.get("db", "0")
    if not text.isdigit():
        raise ValueError(f"database must be a number, got {text!r}")
    return int(text)


def _split_netloc(url: str, shown: str) -> tuple[str | None, str | None, str, str, str]:
    """(username, password, host list, path, query) of a multi-host URL, which urlsplit
    cannot read (it wants one port)."""
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if not netloc:
        raise ConfigError(f"no host in Redis URL {shown!r}; accepted: {ACCEPTED_FORMS}")
    return username, password, netloc, path if slash else "", query


def _hosts(netloc: str, default_port: int, shown: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.split(","):
        match = _HOST_PORT.match(item.strip())
        port = int(match.group(2)) if match and match.group(2) else default_port
        if not match or not 0 < port < 65536:
            raise ConfigError(f"invalid host:port {item!r} in {shown!r}")
        hosts.append((match.group(1).strip("[]"), port))
    return tuple(hosts)


def _sentinel(url: str, tls: bool, shown: str) -> Target:
    username, password, netloc, path, query = _split_netloc(url, shown)
    service, _, db_text = path.partition("/")
    if not service:
        raise ConfigError(
            f"a Sentinel URL names its service: redis+sentinel://host:port/service_name "
            f"(got {shown!r})"
        )
    options = dict(parse_qsl(query))
    try:
        db = _db_of(db_text, options)
    except ValueError as exc:
        raise ConfigError(
            f"invalid Redis URL {shown!r}: {without_secrets_of(str(exc), url)}"
        ) from None
    return Target(
        Topology.SENTINEL,
        hosts=_hosts(netloc, 26379, shown),
        service=unquote(service),
        db=db,
        username=username,
        password=password,
        tls=tls,
        sentinel_username=options.pop("sentinel_username", None),
        sentinel_password=options.pop("sentinel_password", None),
        sentinel_tls=options.pop("sentinel_ssl", options.pop("sentinel_tls", "")).lower() in _TRUE,
        options=options,
    )


def _cluster(url: str, tls: bool, shown: str) -> Target:
    username, password, netloc, path, query = _split_netloc(url, shown)
    if path.strip("/") not in ("", "0"):
        raise ConfigError(f"Redis Cluster has only database 0 (got {shown!r})")
    return Target(
        Topology.CLUSTER,
        hosts=_hosts(netloc, 6379, shown),
        username=username,
        password=password,
        tls=tls,
        options=dict(parse_qsl(query)),
    )


# -- errors ---------------------------------------------------------------------------------


class Failure(StrEnum):
    """What a failed call means for the runner."""

    RETRY = "retry"  # try again (after a pause), perhaps on another node or a new master
    DEMOTED = "demoted"  # a master turned replica (failover): try again on a new connection
    NOSCRIPT = "noscript"  # the server lost its script cache (restart, failover): load, resend
    MOVED = "moved"  # the slot lives elsewhere now: follow it at once
    ASK = "ask"  # the slot is migrating: ask the target node, this once
    UNREACHABLE = "unreachable"  # no such host, TLS refused: retrying will not help soon
    FATAL = "fatal"  # Redis refused the call itself: a ServerError


# Error replies that mean "not here, not now": the call did not run and may be sent again.
_TRANSIENT_REPLIES = (
    "MASTERDOWN",  # a replica that lost its master
    "NOREPLICAS",  # min-replicas-to-write not met right now
    "LOADING",  # a restarted server still loading its data set
    "CLUSTERDOWN",  # the cluster is failing over
    "TRYAGAIN",  # a multi-key call during a slot migration
    "UNBLOCKED",  # a blocked client moved by a failover
)


# Redis 6.2 wraps an error that a script's redis.call met in its own; 7.x passes it on as is:
# "Error running script (call to f_<sha>): @user_script:17: @user_script: 17: -NOREPLICAS ..."
_WRAPPED_IN_SCRIPT_ERROR = re.compile(r"(?:ERR )?Error running script .*?: -([A-Z]+ .*)$", re.S)


def unwrapped_reply(message: str) -> str:
    """An error reply as Redis 7 words it: the error a script met, for Redis 6.2's wrapping
    (so a 6.2 master short of replicas, or full, is told apart from a failing script)."""
    wrapped = _WRAPPED_IN_SCRIPT_ERROR.match(message)
    return wrapped.group(1) if wrapped else message


def classify_reply(message: str) -> Failure:
    """The meaning of an error reply (a redis-py ``ResponseError``'s text)."""
    head = unwrapped_reply(message).split(" ", 1)[0].upper()
    if head == "NOSCRIPT":
        return Failure.NOSCRIPT
    if head == "MOVED":
        return Failure.MOVED
    if head == "ASK":
        return Failure.ASK
    if head == "READONLY":
        return Failure.DEMOTED
    if head in _TRANSIENT_REPLIES:
        return Failure.RETRY
    return Failure.FATAL


def classify_connection_error(exc: BaseException) -> Failure:
    """A lost or refused connection: RETRY, unless its cause says that retrying will not
    help soon (a host name that does not resolve, a TLS handshake refused)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror | ssl.SSLCertVerificationError):
            return Failure.UNREACHABLE
        if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError):
            return Failure.UNREACHABLE
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text:
        return Failure.UNREACHABLE
    if "SSL" in text and ("certificate" in text or "handshake" in text or "wrong version" in text):
        return Failure.UNREACHABLE
    return Failure.RETRY


def redirect_of(message: str) -> tuple[int, str, int]:
    """(slot, host, port) of a ``MOVED`` or ``ASK`` reply."""
    _, slot, address = message.split(" ", 2)
    host, _, port = address.strip().rpartition(":")
    return int(slot), host.strip("[]"), int(port)


class FailoverNews(StrEnum):
    """What a sentinel's announcement means for a client of its service."""

    PROMOTING = "promoting"  # a replica is about to be promoted: hold the calls
    SWITCHED = "switched"  # the new master is known: reconnect, go on
    ABORTED = "aborted"  # the failover was given up: the old master stays, go on


def failover_news(channel: str, data: bytes, service: str) -> FailoverNews | None:
    """The meaning of a message on one of Sentinel's event channels for ``service`` (None if
    it is about another service or means nothing to a client). A replica's events name their
    master after an ``@`` (``slave <addr> <ip> <port> @ <service> <ip> <port>``), a master's
    events name it second (``master <service> <ip> <port>``)."""
    words = data.split()
    name = service.encode()
    if channel == "+switch-master":
        return FailoverNews.SWITCHED if words[:1] == [name] else None
    at = words.index(b"@") if b"@" in words else -1
    about = words[at + 1 : at + 2] if at >= 0 else words[1:2] if words[:1] == [b"master"] else []
    if about != [name]:
        return None
    if channel == "+failover-state-send-slaveof-noone":
        return FailoverNews.PROMOTING
    return FailoverNews.ABORTED if channel.startswith("-failover-abort") else None


def new_master_of(data: bytes) -> tuple[str, int] | None:
    """The new master's address in a ``+switch-master`` message (``<service> <old-ip>
    <old-port> <new-ip> <new-port>``); None if it does not read as one."""
    words = data.split()
    if len(words) != 5 or not words[4].isdigit():
        return None
    return words[3].decode(errors="replace"), int(words[4])


@dataclass(slots=True)
class Backoff:
    """Pauses between tries: doubling from ``first`` to ``cap``, cut short by a deadline."""

    first: float = 0.02
    cap: float = 2.0
    current: float = 0.0

    def pause(self, now: float, deadline: float | None) -> float:
        self.current = self.first if self.current == 0 else min(self.current * 2, self.cap)
        return self.current if deadline is None else max(min(self.current, deadline - now), 0)
