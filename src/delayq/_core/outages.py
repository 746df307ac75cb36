"""The log policy of Redis outages, for the whole process: one WARNING when an outage starts
(which Redis, why), one INFO when it ends (how long), whatever the number of parts that see it.

A Redis that goes away is seen at once by every part of a process that talks to it: the
runner of each handle, each pub/sub connection, a worker's fetch loops, the exporter's
scrapes. Each part reports its failed tries with :meth:`Outages.lost` and its first success
after them with :meth:`Outages.back`. An outage is one Redis (the URL, password masked) and one
cause (unreachable, LOADING, READONLY, ...): its first report logs the warning, the others
nothing above DEBUG, and the INFO comes when the first part that saw it gets through again:
Redis answers (the parts still pausing between their tries follow within their backoff). A
part closed during an outage is :meth:`~Outages.forget`-ten; an outage left with no part ends
without a line.

The parts call :meth:`~Outages.back` only after they reported a loss (a flag of their own), so
a call that succeeds costs nothing here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from .errors_text import redis_error_text
from .text import printable

log = logging.getLogger("delayq")

# Error replies that mean "this Redis cannot serve now", each its own cause.
_REPLY_CAUSES: Final = ("LOADING", "READONLY", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN",
                        "TRYAGAIN", "BUSY", "NOAUTH", "WRONGPASS", "OOM", "MISCONF")  # fmt: skip


# Where a code sits in a wrapped message: "(OOM ...)", "queue 'q': OOM ...", and Redis 6.2's
# script error "... @user_script: 17: -OOM ...".
_BEFORE_CODE: Final = ("(", ": ", ": -")


def cause_of(error: BaseException) -> str:
    """What kind of failure ``error`` is: ``unreachable`` for every lost or refused
    connection and timeout (they alternate during one outage), the code of an error reply
    that means "not now" (``LOADING``), else the exception's type name."""
    text = str(error)
    for code in _REPLY_CAUSES:
        if text.startswith(code) or any(f"{sep}{code} " in text for sep in _BEFORE_CODE):
            return code
    if isinstance(error, ConnectionError | TimeoutError | OSError):
        return "unreachable"
    name = type(error).__name__
    if name in ("ConnectionError", "TimeoutError", "RedisUnavailable", "BusyLoadingError"):
        return "unreachable"  # redis-py's own classes, not the builtins
    return name


def refused_for_now(error: BaseException) -> bool:
    """Whether ``error`` is a reply that speaks of the server, not of the call: memory full,
    a script running, replicas missing, a failing disk. The call was not run; the same call
    can go through once the server recovers (work kept for later waits for it)."""
    return cause_of(error) in _REPLY_CAUSES


def where_of(error: BaseException, default: str) -> str:
    """The Redis ``error`` (or an error it was raised from) names as ``where``: a queue adds
    its name by raising a new error from the runner's."""
    seen: BaseException | None = error
    while seen is not None:
        where = getattr(seen, "where", None)
        if isinstance(where, str) and where:
            return where
        seen = seen.__cause__
    return default


@dataclass(eq=False)
class _Outage:
    began: float  # monotonic
    what: str  # what failed first, for the end's line
    parties: set[int] = field(default_factory=set)
    tries: int = 0


class Outages:
    """The outages under way in this process (one instance, :data:`OUTAGES`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # parts on several threads report at once
        self._open: dict[tuple[str, str], _Outage] = {}

    def lost(self, where: str, party: object, error: BaseException, what: str) -> bool:
        """A failed try of ``party`` (any object, by identity) on the Redis ``where``;
        ``what`` names what failed (``calls``, ``pub/sub``, ``fetch from orders``). Whether
        it started an outage (then it logged the warning)."""
        key = (where, cause_of(error))
        with self._lock:
            outage = self._open.get(key)
            first = outage is None
            if outage is None:
                outage = self._open[key] = _Outage(time.monotonic(), what)
            outage.parties.add(id(party))
            outage.tries += 1
        if first:
            log.warning(
                "delayq: Redis at %s unavailable (%s: %s): %s failing, retrying; logged once "
                "until it answers",
                printable(where), key[1], printable(redis_error_text(error)), printable(what),
            )  # fmt: skip
        else:
            log.debug("delayq: Redis at %s: %s failed again (%s)", where, what, error)
        return first

    def back(self, where: str, party: object) -> None:
        """``party`` got through to ``where`` after failing: Redis answers again, so the
        outages it saw there end, with one line each (the other parts, back later or not
        yet, log nothing more)."""
        ended = self._leave(where, party)
        for (_, cause), outage in ended:
            log.info(
                "delayq: Redis at %s available again after %.1f s (%s; %d failed tries)",
                printable(where), time.monotonic() - outage.began, cause, outage.tries,
            )  # fmt: skip

    def forget(self, party: object) -> None:
        """``party`` is closed: it waits on no outage any more (one left with no part ends
        without a line: nothing resumed)."""
        with self._lock:
            for key, outage in list(self._open.items()):
                outage.parties.discard(id(party))
                if not outage.parties:
                    del self._open[key]

    def under_way(self) -> list[tuple[str, str]]:
        """The (Redis, cause) of each outage under way."""
        with self._lock:
            return sorted(self._open)

    def _leave(self, where: str, party: object) -> list[tuple[tuple[str, str], _Outage]]:
        ended = []
        with self._lock:
            for key, outage in list(self._open.items()):
                if key[0] == where and id(party) in outage.parties:
                    ended.append((key, self._open.pop(key)))
        return ended


OUTAGES: Final = Outages()
