from __future__ import annotations

from delayq._core.wakeups import WakeLog, due_of


def test_news_since_gives_the_earliest_announced_due_time() -> None:
    log = WakeLog()
    mark = log.generation
    log.push(5_000)
    log.push(3_000)
    log.push(4_000)
    assert log.news_since(mark) == (3, 3_000)
    assert log.news_since(2) == (3, 4_000)


def test_any_unknown_news_means_look_at_redis() -> None:
    log = WakeLog()
    log.push(5_000)
    log.push(None)  # a reconnect: messages may have been missed
    assert log.news_since(0) == (2, None)


def test_news_that_fell_out_of_the_history_is_unknown() -> None:
    log = WakeLog()
    for due in range(1_000):
        log.push(due)
    assert log.news_since(0) == (1_000, None)
    assert log.news_since(999) == (1_000, 999)


def test_due_of_reads_only_numbers() -> None:
    assert due_of(b"1764512345678") == 1764512345678
    assert due_of("12") == 12
    assert due_of(b"stop") is None
    assert due_of(None) is None
    assert due_of([1]) is None
