"""Key names, task ids, script arguments and replies (delayq._core.keys / protocol / models):
pure, no Redis."""

from __future__ import annotations

import itertools
import math
import re
import time
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
from redis.cluster import key_slot
from redis.crc import key_slot as crc_key_slot

from delayq import Backoff, ConfigError, DedupMode, InvalidTaskError, Stats, TaskState
from delayq._core import protocol
from delayq._core.keys import FEATURE_ROLES, KEY_ROLES, QueueKeys, validate_name
from delayq._core.models import to_datetime
from delayq._core.protocol import (
    MAX_ID_LEN,
    MAX_KEY_LEN,
    Policy,
    check_headers,
    check_id,
    check_key,
    check_priority,
    new_task_id,
)
from delayq._core.scripts import PLAIN, Op, script

# -- keys -------------------------------------------------------------------------------------

NAMES = ["q", "orders", "Q1", "a.b:c-d_e", "0", "x" * 200, "emails:high", "a{b"[:1]]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prefix", ["dq", "app:jobs", "P_1.x-y", "z" * 64])
def test_every_key_carries_the_hash_tag_and_shares_one_slot(name: str, prefix: str) -> None:
    keys = QueueKeys(prefix, name)
    every = [*keys.all, keys.channel]
    assert len(keys.all) == len(KEY_ROLES) == len(set(keys.all))
    for k in every:
        assert f"{{{name}}}" in k
        assert k.startswith(f"{prefix}:")
        # the first {...} of the key is the tag, so Redis Cluster hashes only the name
        assert re.search(r"\{([^}]*)\}", k).group(1) == name  # type: ignore[union-attr]
    slots = {key_slot(k.encode()) for k in every}
    assert slots == {crc_key_slot(name.encode())}
    assert len(slots) == 1


def test_key_names_are_stable() -> None:
    keys = QueueKeys("dq", "orders")
    assert keys.key("tasks") == "dq:{orders}:tasks"
    assert keys.all[0] == "dq:{orders}:delayed"
    assert keys.all == tuple(f"dq:{{orders}}:{role}" for role in KEY_ROLES)
    assert keys.channel == "dq:{orders}:events"
    assert keys.registry == "dq:queues"


def test_key_order_matches_the_lua_preamble() -> None:
    preamble = script(Op.ACK).source
    unpacked = re.search(r"local (K_DELAYED.*?) = unpack\(KEYS\)", preamble, re.S)
    assert unpacked is not None
    names = [n.strip() for n in unpacked.group(1).split(",")]
    assert len(names) == len(KEY_ROLES)
    expected = {
        "delayed": "K_DELAYED",
        "tasks": "K_TASKS",
        "inflight": "K_INFLIGHT",
        "dead": "K_DEAD",
        "counters": "K_COUNTERS",
        "events": "K_EVENTS",
    }
    for role, var in expected.items():
        assert names[KEY_ROLES.index(role)] == var


def test_different_queues_get_different_slots_usually() -> None:
    slots = {key_slot(QueueKeys("dq", f"q{i}").key("tasks").encode()) for i in range(50)}
    assert len(slots) > 40


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-q",
        "_q",
        ".q",
        ":q",
        "a b",
        "a{b}",
        "{a}",
        "a}",
        "a{",
        "a/b",
        "a*",
        "é",
        "q\n",
        "x" * 201,
        None,
        1,
        b"q",
    ],
)
def test_invalid_queue_names_are_config_errors(name: object) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        validate_name(name)
    with pytest.raises(ConfigError):
        QueueKeys("dq", name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_valid_queue_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("prefix", ["", "a b", "{x}", "x" * 65, None, "é"])
def test_invalid_prefixes_are_config_errors(prefix: object) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        QueueKeys(prefix, "q")  # type: ignore[arg-type]


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_name("")


# -- task ids ---------------------------------------------------------------------------------

_ID = re.compile(r"[-0-9A-Za-z_~]{14}")  # URL-safe characters only


def test_task_ids_are_16_url_safe_chars_and_unique() -> None:
    ids = [new_task_id() for _ in range(5000)]
    assert all(_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_task_ids_sort_in_creation_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "_counter", itertools.count())  # no wrap in this test
    ids = [new_task_id() for _ in range(20_000)]
    assert ids == sorted(ids)


def test_task_ids_sort_in_creation_order_within_one_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol, "_counter", itertools.count())
    frozen = time.time_ns()
    monkeypatch.setattr(protocol.time, "time_ns", lambda: frozen)
    ids = [new_task_id() for _ in range(1000)]
    assert ids == sorted(ids)


def test_task_ids_encode_their_creation_time() -> None:
    alphabet = protocol._ALPHABET
    before = time.time_ns() // 1_000_000
    task_id = new_task_id()
    after = time.time_ns() // 1_000_000
    n = 0
    for ch in task_id:
        n = n * 64 + alphabet.index(ch)
    assert before <= n >> 36 <= after  # 84 bits: 48 of ms, 12 of counter, 24 random


def test_later_ids_sort_after_earlier_ones_across_milliseconds() -> None:
    first = new_task_id()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.003:
        pass
    assert new_task_id() > first


def test_task_ids_sort_in_creation_order_across_counter_wrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol, "_counter", itertools.count(0xFFF - 5))
    frozen = time.time_ns()
    monkeypatch.setattr(protocol.time, "time_ns", lambda: frozen)  # all in one millisecond
    ids = [new_task_id() for _ in range(20)]
    assert ids == sorted(ids)


# -- argument checks --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "x" * MAX_ID_LEN, "order:42", "é"])
def test_check_id_accepts(value: str) -> None:
    assert check_id(value) == value


@pytest.mark.parametrize("value", ["", "x" * (MAX_ID_LEN + 1), None, 42, b"id"])
def test_check_id_rejects(value: object) -> None:
    with pytest.raises(InvalidTaskError, match="id must be"):
        check_id(value)


@pytest.mark.parametrize("value", ["", "k" * (MAX_KEY_LEN + 1), None, 1, b"k"])
def test_check_key_rejects(value: object) -> None:
    with pytest.raises(InvalidTaskError, match="key must be"):
        check_key(value)
    assert check_key("k" * MAX_KEY_LEN)


@pytest.mark.parametrize("value", range(10))
def test_check_priority_accepts_0_to_9(value: int) -> None:
    assert check_priority(value) == value


@pytest.mark.parametrize("value", [-1, 10, 100, True, False, 1.0, "1", None])
def test_check_priority_rejects(value: object) -> None:
    with pytest.raises(InvalidTaskError, match="priority"):
        check_priority(value)


def test_check_headers() -> None:
    assert check_headers(None) == {}
    assert check_headers({"a": "b"}) == {"a": "b"}
    for bad in [{"a": 1}, {1: "a"}, {"a": None}, [("a", "b")], "a=b", {"a": b"b"}]:
        with pytest.raises(InvalidTaskError, match="headers"):
            check_headers(bad)


# -- script arguments and replies -------------------------------------------------------------


def test_parse_offer() -> None:
    assert protocol.parse_offer([b"a", 1, b"b", 0, b"c", 2]) == [("a", 1), ("b", 0), ("c", 2)]
    assert protocol.parse_offer([]) == []


def test_parse_fetch() -> None:
    reply = [1000, -1, b"10", b"id1", b"{}", 2, 990, 9, b"n-1", b"id2", b"[]", 1, 995, 0, b""]
    result = protocol.parse_fetch(reply)
    assert result.next_wake_ms is None
    one, two = result.tasks
    assert (one.id, one.envelope, one.attempts, one.due_ms, one.priority, one.token) == (
        "id1",
        b"{}",
        2,
        990,
        0,
        "n-1",
    )
    assert (two.priority, two.token) == (9, None)
    assert result.acked == [True, False]  # the statuses of the acks sent along
    assert protocol.parse_fetch([5, 77, b""]).next_wake_ms == 77
    assert protocol.parse_fetch([5, 77, b""]).tasks == []
    assert protocol.parse_fetch([5, 77, b""]).acked == []


def test_an_at_most_once_fetch_carries_what_the_offer_gave_not_a_lease() -> None:
    reply = [1000, -1, b"", b"id1", b"{}", 1, 990, 9, b"60000,1000500,tenant,a", b"id2", b"{}"]
    reply += [1, 995, 9, b""]
    one, two = protocol.parse_fetch(reply, leased=False).tasks
    assert (one.token, one.kept, two.token, two.kept) == (None, "60000,1000500,tenant,a", None, "")
    options = protocol.kept_options(one.kept, now_ms=1000000)
    assert options == {
        "key_ttl": timedelta(seconds=60),
        "ttl": timedelta(milliseconds=500),
        "limit_key": "tenant,a",  # a limit key may hold commas: it comes last
    }
    assert protocol.kept_options("0,1000500,", now_ms=1001000) == {"ttl": timedelta(milliseconds=1)}
    assert protocol.kept_options("", now_ms=0) == {}


def test_parse_info_known_and_unknown() -> None:
    assert protocol.parse_info([5, b"", b"", 0, b"", b"", b""]).state == ""
    info = protocol.parse_info([5, b"delayed", b"17000000000000", 2, b"{}", b"oops", b"123"])
    assert info.state == "delayed"
    assert info.score_ms == 1_700_000_000_000
    assert info.attempts == 2 and info.envelope == b"{}" and info.error == "oops"
    assert info.expires_ms == 123
    info = protocol.parse_info([5, b"dead", b"10", 0, b"", b"", b""])
    assert info.envelope is None and info.error is None and info.expires_ms is None


def test_parse_stats() -> None:
    reply = [9, 1, 2, 3, 4, 5, -1, 77, 6, b"acked", b"6", b"offered", 7, b"seen_ms", b"8"]
    reply += [b"late:5", 2, b"late:inf", 1, b"late:sum", 100_010]
    raw = protocol.parse_stats(reply)
    lateness = raw.lateness
    assert (lateness[0.005], lateness[math.inf], sum(lateness.values())) == (2, 1, 3)
    assert list(lateness) == sorted(lateness)  # cumulative sums can be taken in order
    assert (raw.lateness_sum, raw.seen_ms, raw.now_ms) == (100.01, 8, 9)
    assert (raw.delayed, raw.ready, raw.inflight, raw.dead, raw.overdue) == (1, 2, 3, 4, 5)
    assert raw.expired == 6  # leases that ran out: apart from the 3 live ones
    assert (raw.oldest_due_ms, raw.next_due_ms, raw.total) == (None, 77, 16)
    assert raw.counters == {"acked": 6, "offered": 7}
    assert protocol.parse_stats([9, 0, 0, 0, 0, 0, 4, -1]).oldest_due_ms == 4
    stats = protocol.stats_from_reply("q", [9_000, 0, 1, 0, 0, 1, 4_000, -1])
    assert (stats.queue, stats.ready, stats.oldest_overdue_age, stats.next_due_at) == (
        "q",
        1,
        5.0,
        None,
    )
    assert stats.consumer_seen_at is None and stats.counters == {}


def test_parse_dead() -> None:
    rows = protocol.parse_dead([b"a", 50, 3, b"boom", b"{}", b"b", 60, 1, b"", b""])
    assert rows == [("a", 50, 3, "boom", b"{}"), ("b", 60, 1, None, b"")]
    assert (rows[0].id, rows[0].dead_ms, rows[0].attempts) == ("a", 50, 3)
    assert (rows[1].error, rows[1].envelope) == (None, b"")
    assert protocol.parse_dead([]) == []


def test_parse_tasks() -> None:
    reply = [1_000, b"a", b"17000000000009", 2, b"{}", b"oops \xff", b"1700000000500"]
    reply += [b"b\xfe", b"20", 0, b"", b"", b""]
    one, two = protocol.parse_tasks(reply)
    assert one == ("a", 1_700_000_000_000, 2, b"{}", "oops \\xff", 1_700_000_000_500)
    # An id that is not UTF-8 survives, as fetch reads it; nothing stored reads as None.
    assert two.id.encode("utf-8", "surrogateescape") == b"b\xfe"
    assert (two.score_ms, two.attempts, two.envelope, two.error, two.expires_ms) == (
        2,
        0,
        b"",
        None,
        None,
    )
    assert protocol.parse_tasks([1_000]) == []


def test_parse_statuses_of_ack_and_cancel() -> None:
    assert protocol.parse_ack([1, 0, b"1"]) == [True, False, True]
    assert protocol.parse_cancel([0]) == [False]
    assert protocol.parse_ack([]) == []


def test_parse_reschedule_requeue_purge() -> None:
    assert protocol.parse_reschedule([1, 5_000]) == protocol.Rescheduled(True, 5_000)
    moved = protocol.parse_reschedule([0, b"4000"])
    assert (moved.moved, moved.ms) == (False, 4_000)
    requeued = protocol.parse_requeue([2, b"5"])
    assert (requeued.requeued, requeued.examined) == (2, 5)
    moved_count, examined = requeued  # a tuple too, for the requeue loop
    assert (moved_count, examined) == (2, 5)
    assert protocol.parse_purge([b"17"]) == 17


@pytest.mark.parametrize(
    ("status", "held"),
    [
        (protocol.NackStatus.LEASE_LOST, False),
        (protocol.NackStatus.SCHEDULED, True),
        (protocol.NackStatus.DEAD, True),
        (protocol.NackStatus.RESENT, True),  # done by the first call, whose reply was lost
    ],
)
def test_parse_nack(status: protocol.NackStatus, held: bool) -> None:
    nacked = protocol.parse_nack([int(status), b"123"])
    assert (nacked.status, nacked.ms, nacked.held) == (status, 123, held)
    assert nacked.status is status


def test_parse_extend() -> None:
    assert protocol.parse_extend(1_700_000_000_000) == 1_700_000_000_000
    assert protocol.parse_extend(b"5") == 5
    assert protocol.parse_extend(-1) is None


def test_nack_args_truncate_long_errors() -> None:
    policy = Policy(30_000, 5, Backoff(base=1, max=8, jitter=0))
    args = protocol.nack_args(policy, "id", "tok", "retry", -1, "e" * 10_000)
    assert args[:4] == ["id", "tok", "retry", -1]
    assert args[4] == "e" * 4000
    assert args[5:9] == [5, 1000, 8000, "1.000000"]
    assert args[9] == ""  # no throttle due time
    assert args[10] == "e" * 499 + "…"  # the error's gist, for a task history


def test_fetch_args() -> None:
    policy = Policy(30_000, 5, Backoff(base=0.05, max=0.2, jitter=0))
    args = protocol.fetch_args(policy, 7, 15_000)
    assert args[0] == 7 and args[1] == 30_000 and args[3] == 5
    assert args[4:7] == [50, 200, "1.000000"]
    assert args[7] == policy.housekeeping
    assert args[2] != protocol.fetch_args(policy, 7, 15_000)[2]  # a fresh nonce per call
    assert args[8] == 15_000


def test_every_op_has_a_script_with_the_preamble() -> None:
    for op in Op:
        entry = script(op)
        standalone = "(standalone" in entry.source
        assert entry.source.startswith("-- Shared preamble") != standalone, op
        assert re.fullmatch(r"[0-9a-f]{40}", entry.sha)
    assert len({script(op).sha for op in Op}) == len(Op)


def test_scripts_carry_only_the_library_functions_they_use() -> None:
    ack = script(Op.ACK).source
    assert "local function release_key" in ack  # used
    assert "local function backoff_ms" not in ack  # not used: costs every call
    fetch = script(Op.FETCH).source
    assert "local function backoff_ms" in fetch and "local function bury" in fetch
    assert "local function forget" in fetch and "local function release_key" in fetch


def test_plain_scripts_carry_stand_ins_instead_of_the_optional_subsystems() -> None:
    for op, plain in PLAIN.items():
        full, lean = script(op).source, script(plain).source
        assert "\nif plain_refused() then return false end\n" in lean
        assert script(op).sha != script(plain).sha
        for subsystem in ("fair_join", "hist_cut", "sched_offer", "limit_spec"):
            assert f"local function {subsystem}(" in full, (op, subsystem)
            assert f"local function {subsystem}(" not in lean, (plain, subsystem)
        assert lean.count("local function ") <= full.count("local function ") - 18


def test_the_plain_refusal_names_every_feature_key() -> None:
    """plain_refused() looks at the feature keys the client sends (FEATURE_ROLES): one added
    to the library's FLOW_KEYS (or the histories' and schedules' keys) must be sent too, or
    the plain scripts would serve a queue that uses it."""
    lib = resources.files("delayq._core").joinpath("lua", "_lib.lua").read_text("utf-8")
    table = re.search(r"^ *local FLOW_KEYS = (\{.*?\}\})", lib, re.MULTILINE | re.DOTALL)
    assert table is not None
    roles = {*re.findall(r"'([\w:]+)'", table.group(1)), "hist", "sched:due", "sched:fire"}
    assert set(FEATURE_ROLES) == roles and len(FEATURE_ROLES) == len(roles)
    keys = QueueKeys("p", "q")
    assert keys.features == tuple(keys.key(role) for role in FEATURE_ROLES)
    guard = script(Op.FETCH_PLAIN).source.split("local function plain_refused()")[1]
    guard = guard.split("\nend\n")[0]
    exists = re.search(r"redis\.call\('EXISTS', ([^)]*)\)", guard)
    assert exists is not None
    args = re.findall(r"K_EXPIRY|KEYS\[(\d+)\]", exists.group(1))
    assert args.count("") == 1  # K_EXPIRY, once: an odd count is its
    named = [int(n) for n in args if n]
    first = 15  # after the 13 queue keys and the receipt
    assert sorted(set(named)) == list(range(first, first + len(FEATURE_ROLES)))
    assert all(named.count(n) == 2 for n in set(named))


def test_every_script_defines_its_functions_before_calling_them() -> None:
    """A local function called above its definition would be looked up as a global, which
    fails at run time only (a stand-in placed after its callers, for one)."""
    for op in Op:
        source = script(op).source
        for name in re.findall(r"^local function (\w+)\(", source, re.MULTILINE):
            first_call = re.search(rf"(?<![\w.:]){name}\(", source)
            assert first_call is not None and source[: first_call.start()].endswith(
                "local function "
            ), (op, name)


# -- models -----------------------------------------------------------------------------------


def test_backoff_defaults_and_args() -> None:
    b = Backoff()
    assert (b.base, b.max, b.jitter) == (1.0, 300.0, 0.5)
    base, cap, factor = Backoff(base=0.05, max=0.2, jitter=0).args()
    assert (base, cap, factor) == (50, 200, "1.000000")
    for _ in range(200):
        f = float(Backoff(jitter=0.5).args()[2])
        assert 0.5 <= f <= 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": 0},
        {"base": -1},
        {"base": 2, "max": 1},
        {"jitter": 1},
        {"jitter": -0.1},
        {"jitter": 1.5},
    ],
)
def test_backoff_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="backoff"):
        Backoff(**kwargs)


@pytest.mark.parametrize("kwargs", [{"base": math.nan}, {"max": math.nan}, {"jitter": math.nan}])
def test_backoff_rejects_nan(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Backoff(**kwargs)


def test_backoff_with_an_infinite_cap_is_refused_or_usable() -> None:
    try:
        backoff = Backoff(base=1, max=math.inf)
    except ConfigError:
        return
    base, cap, factor = backoff.args()
    assert base == 1000 and cap >= base and float(factor) > 0


def test_to_datetime() -> None:
    assert to_datetime(None) is None
    assert to_datetime(1_704_067_200_500) == datetime(2024, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)


def test_stats_total_and_enums() -> None:
    s = Stats("q", 1, 2, 3, 4, 0, 0.0, None)
    assert s.total == 10
    assert Stats("q", 1, 2, 3, 4, 0, 0.0, None, expired=5).total == 15
    assert [m.value for m in TaskState] == [
        *("delayed", "ready", "inflight", "expired", "dead"),
        *("done", "cancelled"),  # ended, known from a task history
    ]
    assert DedupMode("keep") is DedupMode.KEEP and DedupMode("replace") is DedupMode.REPLACE
