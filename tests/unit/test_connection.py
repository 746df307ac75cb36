"""The connection layer's pure parts: every URL form, and what each error means."""

from __future__ import annotations

import socket
import ssl

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError

from delayq import ConfigError
from delayq._core.connection import (
    DEFAULT_URL,
    Backoff,
    Failure,
    Topology,
    classify_connection_error,
    classify_reply,
    default_url,
    packed,
    parse_url,
    redirect_of,
)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:pw@db.example:6380/2",
        "rediss://user:pw@db.example:6380",
        "unix:///run/redis.sock?db=3",
        "REDIS://127.0.0.1",
    ],
)
def test_standalone_urls(url: str) -> None:
    target = parse_url(url)
    assert target.topology is Topology.STANDALONE
    assert target.url == url


def test_standalone_details() -> None:
    assert parse_url("redis://h:1/5").db == 5
    assert parse_url("unix:///s.sock?db=3").db == 3
    assert parse_url("rediss://h").tls


def test_sentinel_url_with_every_part() -> None:
    target = parse_url(
        "redis+sentinel://app:p%40ss@s1:26379,s2,[::1]:26380/mymaster/2"
        "?sentinel_password=spw&sentinel_username=su&sentinel_ssl=true"
    )
    assert target.topology is Topology.SENTINEL
    assert target.hosts == (("s1", 26379), ("s2", 26379), ("::1", 26380))
    assert target.service == "mymaster" and target.db == 2
    assert (target.username, target.password) == ("app", "p@ss")
    assert (target.sentinel_username, target.sentinel_password) == ("su", "spw")
    assert target.sentinel_tls and not target.tls
    assert parse_url("rediss+sentinel://s1/m").tls


def test_cluster_url() -> None:
    target = parse_url("redis+cluster://:pw@n1:7000,n2:7001,n3")
    assert target.topology is Topology.CLUSTER
    assert target.hosts == (("n1", 7000), ("n2", 7001), ("n3", 6379))
    assert target.password == "pw"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379", "unsupported URL scheme 'http'"),
        ("127.0.0.1:6379", "not a Redis URL"),
        ("", "non-empty string"),
        ("redis://h:99999/0", "invalid Redis URL"),
        ("redis://h:1/zero", "database must be a number"),
        ("redis://:s3cret@h:port/0", "invalid Redis URL"),
        ("redis+sentinel://s1:26379", "names its service"),
        ("redis+sentinel://s1:notaport/m", "invalid host:port"),
        ("redis+cluster://n1:7000/3", "only database 0"),
        ("unix://", "no socket path"),
    ],
)
def test_bad_urls_are_config_errors_that_name_the_accepted_forms(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        parse_url(url)
    assert "s3cret" not in str(caught.value)
    if "scheme" in says:
        assert "redis+sentinel://" in str(caught.value) and "redis+cluster://" in str(caught.value)


def test_non_string_url() -> None:
    with pytest.raises(ConfigError):
        parse_url(42)


def test_default_url_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert default_url() == DEFAULT_URL
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:1/0")
    assert default_url() == "redis://elsewhere:1/0"


@pytest.mark.parametrize(
    ("reply", "meaning"),
    [
        ("NOSCRIPT No matching script", Failure.NOSCRIPT),
        ("MOVED 3999 127.0.0.1:7001", Failure.MOVED),
        ("ASK 3999 127.0.0.1:7001", Failure.ASK),
        ("READONLY You can't write against a read only replica.", Failure.DEMOTED),
        ("MASTERDOWN Link with MASTER is down", Failure.RETRY),
        ("NOREPLICAS Not enough good replicas to write.", Failure.RETRY),
        ("LOADING Redis is loading the dataset in memory", Failure.RETRY),
        ("CLUSTERDOWN The cluster is down", Failure.RETRY),
        ("TRYAGAIN Multiple keys request during rehashing of slot", Failure.RETRY),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", Failure.FATAL),
        ("BUSY Redis is busy running a script", Failure.FATAL),
        ("OOM command not allowed when used memory > 'maxmemory'", Failure.FATAL),
        ("ERR user_script:1: something", Failure.FATAL),
        # Redis 6.2's wrapping of an error a script's call met (7.x sends it as above).
        (
            f"Error running script (call to f_{'a' * 40}): @user_script:17: @user_script: 17: "
            "-NOREPLICAS Not enough good replicas to write.",
            Failure.RETRY,
        ),
        (
            f"Error running script (call to f_{'a' * 40}): @user_script:17: @user_script: 17: "
            "-OOM command not allowed when used memory > 'maxmemory'.",
            Failure.FATAL,
        ),
        (
            f"Error running script (call to f_{'a' * 40}): @user_script:3: user_script:3: "
            "attempt to compare nil with number",
            Failure.FATAL,
        ),
    ],
)
def test_error_replies(reply: str, meaning: Failure) -> None:
    assert classify_reply(reply) is meaning


def test_redirections() -> None:
    assert redirect_of("MOVED 3999 127.0.0.1:7001") == (3999, "127.0.0.1", 7001)
    assert redirect_of("ASK 12 [::1]:7002") == (12, "::1", 7002)


def _wrapped(cause: BaseException) -> RedisConnectionError:
    try:
        raise RedisConnectionError("Error connecting") from cause
    except RedisConnectionError as exc:
        return exc


def test_connection_errors_fail_fast_only_when_retrying_cannot_help() -> None:
    assert classify_connection_error(ConnectionRefusedError(111, "refused")) is Failure.RETRY
    assert classify_connection_error(TimeoutError("timed out")) is Failure.RETRY
    dns = _wrapped(socket.gaierror(-2, "Name or service not known"))
    assert classify_connection_error(dns) is Failure.UNREACHABLE
    tls = _wrapped(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    assert classify_connection_error(tls) is Failure.UNREACHABLE
    eof = _wrapped(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert classify_connection_error(eof) is Failure.RETRY
    text_only = RedisConnectionError(
        "Error -2 connecting to nohost:6379. Name or service not known."
    )
    assert classify_connection_error(text_only) is Failure.UNREACHABLE


def test_backoff_doubles_to_its_cap_and_stops_at_the_deadline() -> None:
    backoff = Backoff(first=0.1, cap=0.5)
    assert [backoff.pause(0.0, None) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert Backoff(first=1.0).pause(10.0, 10.25) == 0.25
    assert Backoff(first=1.0).pause(11.0, 10.0) == 0


def test_sentinel_failover_announcements() -> None:
    from delayq._core.connection import FailoverNews, failover_news

    promote = b"slave 127.0.0.1:7001 127.0.0.1 7001 @ shop 127.0.0.1 7000"
    assert failover_news("+failover-state-send-slaveof-noone", promote, "shop") is (
        FailoverNews.PROMOTING
    )
    assert failover_news("+failover-state-send-slaveof-noone", promote, "other") is None
    switch = b"shop 127.0.0.1 7000 127.0.0.1 7001"
    assert failover_news("+switch-master", switch, "shop") is FailoverNews.SWITCHED
    assert failover_news("+switch-master", switch, "shopx") is None
    abort = b"master shop 127.0.0.1 7000"  # a master's event names it second
    assert failover_news("-failover-abort-no-good-slave", abort, "shop") is FailoverNews.ABORTED
    assert failover_news("-failover-abort-no-good-slave", abort, "other") is None
    assert failover_news("+sdown", abort, "shop") is None


def test_packed_commands_are_what_redis_py_sends() -> None:
    """hiredis packs delayq's script calls byte for byte as redis-py's own packer does: str
    (UTF-8), bytes, ints and floats, several commands in one buffer."""
    commands = [
        ("EVALSHA", "ab" * 20, 3, "k1", "k2", "ké", b"\x00\xff\r\n", 12, -3, 0.5, 10**15),
        ("WAIT", 1, 1000),
        ("SET", "", b""),
    ]
    conn = redis.Connection()  # never connected: only its packer is used
    assert packed(commands, conn.pack_commands) == [b"".join(conn.pack_commands(commands))]


def test_packed_leaves_what_hiredis_refuses_to_redis_py() -> None:
    """An argument hiredis cannot pack goes to redis-py's packer, which raises its own error
    for it (a bool), rather than sending something else."""
    conn = redis.Connection()
    with pytest.raises(DataError):
        packed([("SET", "k", True)], conn.pack_commands)
    assert packed([("SET", "k", memoryview(b"v"))], conn.pack_commands) == [
        b"".join(conn.pack_commands([("SET", "k", b"v")]))
    ]
