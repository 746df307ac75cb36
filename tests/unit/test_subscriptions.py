"""The pub/sub connection layer's pure parts: one connection's bookkeeping, the channels of a
subscriber, regrouping by node, outage logging and the pause before dialling again."""

from __future__ import annotations

import pytest

from delayq._core.connection import Backoff, Failure, new_master_of
from delayq._core.subscriptions import (
    Broken,
    Channels,
    Deliver,
    LinkState,
    Live,
    Moved,
    Outage,
    Resend,
    is_shard_channel,
    regroup,
    retry_pause,
)

CLASSIC = "p:{a}:events"
SHARD = "p:{a}:sevents"
OTHER = "p:{b}:sevents"


def confirm(state: LinkState, kind: str, channel: str) -> object:
    return state.on_reply([kind.encode(), channel.encode(), 1])


def test_shard_channels_are_told_by_their_role() -> None:
    assert is_shard_channel(SHARD) and not is_shard_channel(CLASSIC)


def test_a_new_connection_subscribes_every_wanted_channel_each_by_its_kind() -> None:
    state = LinkState()
    assert state.add(SHARD) is None and state.add(CLASSIC) is None  # not connected yet
    assert state.connect() == [("SUBSCRIBE", CLASSIC), ("SSUBSCRIBE", SHARD)]
    assert confirm(state, "subscribe", CLASSIC) == Live(CLASSIC)
    assert confirm(state, "ssubscribe", SHARD) == Live(SHARD)
    assert state.live == {CLASSIC, SHARD}


def test_channels_join_and_leave_the_live_connection() -> None:
    state = LinkState()
    state.connect()
    assert state.add(SHARD) == ("SSUBSCRIBE", SHARD)
    assert state.add(SHARD) is None  # already carried
    assert confirm(state, "ssubscribe", SHARD) == Live(SHARD)
    assert state.add(OTHER) == ("SSUBSCRIBE", OTHER)
    assert state.remove(SHARD) == ("SUNSUBSCRIBE", SHARD)
    assert SHARD not in state.live
    assert confirm(state, "ssubscribe", OTHER) == Live(OTHER)
    assert confirm(state, "sunsubscribe", SHARD) is None  # the one we asked for
    assert state.remove(OTHER) == ("SUNSUBSCRIBE", OTHER) and state.empty


def test_messages_are_delivered_for_wanted_channels_only() -> None:
    state = LinkState()
    state.add(SHARD)
    state.connect()
    assert state.on_reply([b"smessage", SHARD.encode(), b"1700000000123"]) == Deliver(
        SHARD, 1_700_000_000_123
    )
    assert state.on_reply([b"message", SHARD.encode(), b"garbage"]) == Deliver(SHARD, None)
    assert state.on_reply([b"smessage", OTHER.encode(), b"5"]) is None
    assert state.on_reply([b"pong", b""]) is None


def test_a_confirmation_arriving_twice_goes_live_once() -> None:
    state = LinkState()
    state.add(CLASSIC)
    state.connect()
    state.connect()  # e.g. dialled again before the first confirmation: both FIFOs reset
    assert confirm(state, "subscribe", CLASSIC) == Live(CLASSIC)
    assert confirm(state, "subscribe", CLASSIC) is None


def test_a_sunsubscribe_the_client_did_not_ask_for_means_the_slot_moved() -> None:
    state = LinkState()
    state.add(SHARD)
    state.connect()
    confirm(state, "ssubscribe", SHARD)
    assert confirm(state, "sunsubscribe", SHARD) == Moved(SHARD, None)
    assert SHARD not in state.live and SHARD in state.wanted


def test_a_moved_reply_names_the_new_node() -> None:
    state = LinkState()
    state.add(SHARD)
    state.add(OTHER)
    state.connect()
    assert state.on_error("MOVED 1234 10.0.0.7:7002") == Moved(SHARD, ("10.0.0.7", 7002))
    assert confirm(state, "ssubscribe", OTHER) == Live(OTHER)  # the FIFO stayed in step


def test_redis_62_refuses_ssubscribe_and_gets_subscribe_from_then_on() -> None:
    state = LinkState()
    state.add(OTHER)
    state.add(SHARD)
    state.connect()
    refusal = "unknown command 'SSUBSCRIBE', with args beginning with: 'p:{a}:sevents' "
    assert state.on_error(refusal) == Resend((("SUBSCRIBE", SHARD),))
    assert not state.sharded
    assert state.on_error(refusal) == Resend((("SUBSCRIBE", OTHER),))
    assert confirm(state, "subscribe", SHARD) == Live(SHARD)
    assert confirm(state, "subscribe", OTHER) == Live(OTHER)
    assert state.add("p:{c}:sevents") == ("SUBSCRIBE", "p:{c}:sevents")
    assert state.remove(SHARD) == ("UNSUBSCRIBE", SHARD)


def test_a_refused_ssubscribe_of_a_channel_left_meanwhile_is_not_resent() -> None:
    state = LinkState()
    state.add(SHARD)
    state.connect()
    state.remove(SHARD)
    assert state.on_error("unknown command 'SSUBSCRIBE'") is None
    assert state.on_error("unknown command 'SUNSUBSCRIBE'") is None
    assert not state.sharded


@pytest.mark.parametrize(
    "message", ["NOPERM this user has no permissions to access the channel", "LOADING busy"]
)
def test_other_refusals_break_the_connection(message: str) -> None:
    state = LinkState()
    state.add(CLASSIC)
    state.connect()
    assert isinstance(state.on_error(message), Broken)


def test_an_error_reply_nobody_waits_for_breaks_the_connection() -> None:
    assert isinstance(LinkState().on_error("ERR what"), Broken)


def test_a_lost_connection_leaves_nothing_live_and_resubscribes_on_connect() -> None:
    state = LinkState()
    state.add(CLASSIC)
    state.connect()
    confirm(state, "subscribe", CLASSIC)
    state.lose()
    assert state.live == set() and not state.connected
    assert state.add(SHARD) is None and state.remove(SHARD) is None  # nothing sent while away
    assert state.connect() == [("SUBSCRIBE", CLASSIC)]


def test_silence_asks_for_a_pong_then_gives_up() -> None:
    state = LinkState()
    state.connect()
    assert state.idle() == ("PING",)
    assert state.on_reply([b"pong", b""]) is None
    assert state.idle() == ("PING",)  # the PONG came: a new silence asks again
    assert isinstance(state.idle(), Broken)


def test_forget_drops_a_channel_without_a_command() -> None:
    state = LinkState()
    state.add(SHARD)
    state.connect()
    confirm(state, "ssubscribe", SHARD)
    state.forget(SHARD)
    assert state.empty and state.live == set()


def test_channels_count_handles_and_remember_which_were_live() -> None:
    channels: Channels[str] = Channels()
    assert channels.join(CLASSIC, "a") and not channels.join(CLASSIC, "b")
    assert channels.join(SHARD, "c") and channels.handles([CLASSIC]) == ["a", "b"]
    assert not channels.went_live(CLASSIC)  # the first time: nothing was missed
    assert channels.went_live(CLASSIC)  # back after a loss: look at Redis
    assert not channels.leave(CLASSIC, "x")  # not a handle on it
    assert not channels.leave(CLASSIC, "a")
    assert channels.leave(CLASSIC, "b") and CLASSIC not in channels
    assert channels.handles() == ["c"] and channels.handles([CLASSIC]) == []
    assert channels.join(CLASSIC, "a") and not channels.went_live(CLASSIC)  # a new start
    assert list(channels) == [SHARD, CLASSIC]


def test_a_channel_whose_handles_stopped_waiting_tells_them_to_look_when_it_goes_live() -> None:
    channels: Channels[str] = Channels()
    channels.gave_up(CLASSIC)  # no handle on it: nothing to remember
    assert channels.join(CLASSIC, "a") and not channels.went_live(CLASSIC)
    assert channels.leave(CLASSIC, "a") and channels.join(CLASSIC, "a")
    channels.gave_up(CLASSIC)
    assert channels.went_live(CLASSIC)  # the first time, but "a" looked without it


def test_a_stalled_connection_stays_stalled_until_the_server_answers_a_subscription() -> None:
    state = LinkState()
    state.add(CLASSIC)
    state.add(SHARD)
    state.connect()
    state.stalled = True  # a start gave up waiting
    assert state.on_reply([b"pong", b""]) is None and state.stalled
    assert confirm(state, "subscribe", CLASSIC) == Live(CLASSIC) and not state.stalled
    assert isinstance(confirm(state, "message", CLASSIC), Deliver)
    state.stalled = True
    state.remove(SHARD)  # before its SSUBSCRIBE was answered: no Live, an answer all the same
    assert confirm(state, "ssubscribe", SHARD) is None and not state.stalled


def test_regroup_moves_only_the_channels_served_elsewhere() -> None:
    homes = {"a": ("n1", 1), "b": ("n2", 2), "c": ("n2", 2), "d": ("n3", 3)}
    moves = regroup(["d", "c", "b", "a"], ("n1", 1), homes.__getitem__)
    assert moves == {("n2", 2): ["b", "c"], ("n3", 3): ["d"]}
    assert regroup(["a"], ("n1", 1), homes.__getitem__) == {}


def test_an_outage_is_reported_when_it_begins_and_when_it_ends() -> None:
    outage = Outage()
    assert outage.ended() == 0  # connected at once: nothing to say
    assert outage.failed() and not outage.failed() and not outage.failed()
    assert outage.ended() == 3
    assert outage.failed()


def test_retry_pause_doubles_and_waits_longest_when_retrying_soon_cannot_help() -> None:
    backoff = Backoff()
    pauses = [retry_pause(backoff, Failure.RETRY, 0.0) for _ in range(9)]
    assert pauses[:3] == [0.02, 0.04, 0.08] and pauses[-1] == backoff.cap
    assert retry_pause(Backoff(), Failure.UNREACHABLE, 0.0) == Backoff().cap


def test_the_new_master_is_read_from_a_switch_master_message() -> None:
    assert new_master_of(b"shop 127.0.0.1 7000 10.0.0.2 7001") == ("10.0.0.2", 7001)
    assert new_master_of(b"shop 127.0.0.1 7000") is None
