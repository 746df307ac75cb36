"""The bookkeeping both workers share, written once: which leases a worker holds and in which
state, and what to do next (fetch how many, ack which, extend which, hand back which).

Sans-I/O: the workers make the Redis calls and do the waiting (threads and one lock, or
asyncio), tell the ledger what happened, and ask it what to do. A lease moves through

    fetched -> waiting (the prefetch buffer) -> running -> done (ack pending, then on its way)
                                                        -> given back (retried, rejected...)

and leaves the ledger when its ack is answered or it is given back. The heartbeat extends
every lease held and not done: a done task's ack speaks for its lease.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .._core.protocol import MAX_BATCH

Key = tuple[int, str]  # (index of the queue in the worker's list, task id)

# While handlers run or tasks wait, room grows during a fetch's wait for its due time (or a
# limit's turn): the fetch waits in steps this long, so that when it goes it asks for the
# room there is then, not the room there was when it began waiting. Costs no Redis call.
ROOM_STEP_S = 0.05


@dataclass(eq=False)
class Delivery:
    """One task in a worker's hands, from its handler's start until its verdict is recorded."""

    index: int  # of its queue in the worker's list
    task: Any
    started: float = field(default_factory=time.monotonic)
    settled: bool = False  # the verdict went to Redis: an internal error must not retry it


D = TypeVar("D", bound=Delivery)


@dataclass(frozen=True, slots=True)
class Pace:
    """How a worker batches its round trips: the fewer tasks per fetch or ack, the more Redis
    commands (and thread hand-offs) each task costs."""

    capacity: int  # tasks held per queue, waiting or running: handler slots + prefetch
    refill: int  # with tasks still waiting, fetch only once this many fit
    ack_batch: int  # acks sent as soon as this many are pending...
    ack_delay_s: float  # ...or the oldest waited this long, or no handler of its queue runs

    @classmethod
    def of(cls, slots: int, prefetch: int) -> Pace:
        capacity = slots + prefetch
        # Half the prefetch: the buffer still feeds the handlers during the round trip that
        # refills it, and a burst costs one fetch per >= prefetch/2 tasks, not one per task.
        refill = max(1, min(prefetch // 2, MAX_BATCH))
        # Up to a full buffer's acks in one call: a worker that fetched a batch (a throttled
        # one takes its turn's batch at once) acks it in one call, not in several.
        return cls(capacity, refill, min(max(slots, 16, capacity), 100, MAX_BATCH), 0.02)


class Ledger(Generic[D]):
    """The state of every lease a worker holds, per queue (see the module's docstring).

    Not thread-safe: the thread worker calls it under one lock. ``now`` is monotonic seconds.
    """

    def __init__(self, queues: int, pace: Pace) -> None:
        self.pace = pace
        self.closing = False  # shutting down: every pending ack is due at once
        self._held: dict[Key, Any] = {}  # leased to this worker: waiting, running or done
        self._waiting: list[deque[Any]] = [deque() for _ in range(queues)]
        self._running: list[dict[D, None]] = [{} for _ in range(queues)]  # an ordered set
        self._finishing: set[D] = set()  # running, and done: no more acks to wait for from it
        self._unsure = [0] * queues  # handlers running whose verdict is not known yet
        self._acks: list[list[Any]] = [[] for _ in range(queues)]  # done, ack not sent
        self._acks_since: list[float] = [0.0] * queues  # when the oldest pending ack came
        self._settling: dict[Key, Any] = {}  # done: its ack is pending or on its way
        self._start_by: dict[Key, float] = {}  # waiting: run only until then (lease left)
        self.dropped: list[Any] = []  # lapsed in the buffer, dropped by take(): to report

    # -- fetching ---------------------------------------------------------------------------

    def room(self, index: int) -> int:
        """How many tasks to fetch for queue ``index`` now; 0: wait until a handler ends.
        With the buffer empty, any room is used at once (a handler may be idle); with tasks
        still waiting, only a batch of at least ``pace.refill``."""
        waiting = len(self._waiting[index])
        free = self.pace.capacity - waiting - len(self._running[index])
        if free <= 0 or (waiting and free < self.pace.refill):
            return 0
        return min(free, MAX_BATCH)

    def fetch_wait(self, wanted: int, longest_s: float) -> float:
        """How long a fetch of ``wanted`` tasks (for one queue) may wait for them: the
        worker's poll timeout, or ROOM_STEP_S while more room may come."""
        return longest_s if wanted >= self.pace.capacity else min(longest_s, ROOM_STEP_S)

    def fetched(self, index: int, tasks: Iterable[Any], start_by: float | None = None) -> None:
        """Redis leased ``tasks`` to this worker: held (kept alive) from now, waiting to run.
        ``start_by``: the last moment a handler may begin one while no extension confirms its
        lease (None: no lease, at-most-once)."""
        waiting = self._waiting[index]
        for task in tasks:
            key = (index, task.id)
            self._held[key] = task
            if start_by is not None:
                self._start_by[key] = start_by
            waiting.append(task)

    def extended(self, index: int, task: Any, start_by: float) -> None:
        """An extension of ``task``'s lease got through: it may begin until ``start_by``."""
        key = (index, task.id)
        if self._held.get(key) is task and key in self._start_by:
            self._start_by[key] = start_by

    def waiting(self, index: int) -> int:
        return len(self._waiting[index])

    def held(self) -> int:
        """Leases this worker holds (waiting, running or done and not yet acked)."""
        return len(self._held)

    # -- running ----------------------------------------------------------------------------

    def take(
        self, index: int, make: Callable[[int, Any, float], D], now: float | None = None
    ) -> D | None:
        """The next waiting task of queue ``index``, as a running delivery made by ``make``
        (index, task, start time); None if none waits. A waiting task whose lease may have run
        out (no extension got through since its ``start_by``: Redis refused or was away) is
        dropped, not run: another consumer may have it by now. While :attr:`dropped` holds
        some, :meth:`lapsed` hands them over."""
        waiting = self._waiting[index]
        if not waiting:
            return None
        now = time.monotonic() if now is None else now
        start_by = self._start_by
        if start_by:  # leased tasks wait: the first whose lease still holds
            while waiting:
                task = waiting[0]
                key = (index, task.id)
                if now <= start_by.get(key, now):
                    break
                waiting.popleft()
                if self._held.get(key) is task:
                    del self._held[key]
                del start_by[key]
                self.dropped.append(task)
            if not waiting:
                return None
            task = waiting.popleft()
            start_by.pop((index, task.id), None)  # running: its ack or heartbeat speaks
        else:
            task = waiting.popleft()
        delivery = make(index, task, now)
        self._running[index][delivery] = None
        self._unsure[index] += 1
        return delivery

    def lapsed(self) -> list[Any]:
        """The tasks :meth:`take` dropped since the last call (their leases ran out unseen)."""
        dropped, self.dropped = self.dropped, []
        return dropped

    def ended(self, delivery: D) -> bool:
        """``delivery``'s handler slot is free (it finished, or was abandoned). True if its
        queue's fetch can now refill: tell the fetcher."""
        index = delivery.index
        if self._running[index].pop(delivery, self) is self:
            return False  # ended already (an abandoned handler returning late)
        if delivery in self._finishing:
            self._finishing.discard(delivery)
        else:
            self._unsure[index] -= 1
        return self.room(index) > 0

    def running(self) -> list[D]:
        return [d for running in self._running for d in running]

    def busy(self) -> int:
        return sum(len(running) for running in self._running)

    # -- settling ---------------------------------------------------------------------------

    def done(self, delivery: D, now: float) -> bool:
        """``delivery``'s handler succeeded: its ack is pending. True if the ack loop must look
        again: the acks of its queue are due now, or this is the first one pending, whose
        delay starts now (a loop that saw no ack pending sleeps until woken)."""
        index, task = delivery.index, delivery.task
        self._settling[(index, task.id)] = task
        acks = self._acks[index]
        first = not acks
        if first:
            self._acks_since[index] = now
        acks.append(task)
        if delivery in self._running[index] and delivery not in self._finishing:
            self._finishing.add(delivery)
            self._unsure[index] -= 1
        return first or self._acks_due(index, now)

    def given_back(self, index: int, task: Any) -> None:
        """``task`` is retried, rejected, released or let go: no longer this worker's lease."""
        key = (index, task.id)
        if self._held.get(key) is task:
            del self._held[key]

    def unstarted(self, index: int) -> list[Any]:
        """Empty queue ``index``'s buffer: the tasks fetched and never started (to hand
        back, after which :meth:`given_back`)."""
        waiting = self._waiting[index]
        tasks = list(waiting)
        waiting.clear()
        for task in tasks:
            self._start_by.pop((index, task.id), None)
        return tasks

    def unsettled(self) -> list[tuple[int, Any]]:
        """Leases held that no ack speaks for: at the end of a shutdown, to hand back."""
        return [(i, t) for (i, task_id), t in self._held.items() if not self._is_settling(i, t)]

    # -- acking -----------------------------------------------------------------------------

    def acks_due(self, index: int, now: float) -> list[Any]:
        """The acks of queue ``index`` to send now (they are then on their way), or none."""
        if not self._acks_due(index, now):
            return []
        batch, self._acks[index] = self._acks[index], []
        return batch

    def next_ack_in(self, now: float) -> float | None:
        """Seconds until some pending ack falls due (0: now); None if none is pending."""
        soonest = None
        for index, acks in enumerate(self._acks):
            if not acks:
                continue
            if self._acks_due(index, now):
                return 0.0
            left = self._acks_since[index] + self.pace.ack_delay_s - now
            soonest = left if soonest is None else min(soonest, left)
        return soonest

    def acked(self, index: int, batch: Sequence[Any], results: Sequence[bool | None]) -> list[Any]:
        """Redis answered the acks of ``batch`` (None: this one's ack itself failed, and its
        lease runs out); the tasks whose lease was lost before their ack, to report."""
        lost = []
        for task, ok in zip(batch, results, strict=True):
            key = (index, task.id)
            if self._held.get(key) is task:
                del self._held[key]
            if self._settling.get(key) is task:
                del self._settling[key]
            if ok is False:
                lost.append(task)
        return lost

    def ack_failed(self, index: int, batch: Sequence[Any]) -> None:
        """The acks of ``batch`` did not reach Redis: pending again, due at once (the worker
        paces its retries), ahead of the acks that came since."""
        self._acks[index][:0] = batch
        self._acks_since[index] = float("-inf")

    def _acks_due(self, index: int, now: float) -> bool:
        acks = self._acks[index]
        return bool(acks) and (
            self.closing
            or self._unsure[index] == 0  # no more acks come soon: no reason to wait
            or len(acks) >= self.pace.ack_batch
            or now - self._acks_since[index] >= self.pace.ack_delay_s
        )

    # -- heartbeat --------------------------------------------------------------------------

    def to_extend(self, index: int) -> list[Any]:
        """The leases of queue ``index`` to extend now: every one held, waiting, running or
        done with its ack not yet through (an ack held up, its Redis away, must not let the
        lease lapse: the task would run again)."""
        return [t for (i, _), t in self._held.items() if i == index]

    def lease_lost(self, index: int, task: Any) -> bool:
        """The heartbeat found ``task``'s lease gone. True if that is news to report: the task
        was still held and no ack spoke for it (one may have landed since the heartbeat took
        its list; then its ack, not the heartbeat, says how it went). The task is dropped, and
        if it still waited, not run: another consumer may have it by now."""
        key = (index, task.id)
        if self._held.get(key) is not task or self._is_settling(index, task):
            return False
        del self._held[key]
        waiting = self._waiting[index]
        for position, waiting_task in enumerate(waiting):
            if waiting_task is task:
                del waiting[position]
                self._start_by.pop(key, None)
                break
        return True

    def _is_settling(self, index: int, task: Any) -> bool:
        return self._settling.get((index, task.id)) is task
