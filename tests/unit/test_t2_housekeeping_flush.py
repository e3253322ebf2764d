"""router.routing.t2.transactions.NodeTransactions' housekeeping of the cluster decision rows, with fakes: close()
flushes the rows of the T2s that ended and purges before the node leaves; a failing flush does not stop the tick's
recovery and purge and logs one warning without a traceback."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from router.routing.t2 import transactions as T


class _Log:
    def __init__(self, events: list[str], fail: int = 0) -> None:
        self.events, self.fail = events, fail

    def flush_ended(self) -> None:
        self.events.append("flush")
        if self.fail:
            self.fail -= 1
            raise ConnectionError("PostgreSQL went away")

    def close(self) -> None:
        self.events.append("log.close")


class _Closable:
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def close(self) -> None:
        self.events.append(f"{self.name}.close")

    def expire(self) -> None:
        self.events.append("expire")


class _Stop:
    """A stop event whose wait() says 'not stopped' ``ticks`` times (no real waiting)."""

    def __init__(self, ticks: int) -> None:
        self.ticks = ticks

    def wait(self, timeout: float) -> bool:
        self.ticks -= 1
        return self.ticks < 0

    def set(self) -> None:
        self.ticks = 0


def _node(events: list[str], *, fail: int = 0, ticks: int = 0) -> Any:
    n: Any = object.__new__(T.NodeTransactions)
    n._stop, n._thread = _Stop(ticks), None
    n.coordinator = _Closable(events, "coordinator")
    n.coordinator.log = _Log(events, fail)
    n.log = n.coordinator.log
    n.pg = _Closable(events, "pg")
    n._transport_lock, n._transport = threading.Lock(), None
    n._flush_failing = False
    n.period_s = 0.5
    n._purge = lambda: events.append("purge")
    n.recover_now = lambda: events.append("recover")
    n.maintain_inbox = lambda: True
    return n


def test_close_flushes_the_ended_decision_rows_and_purges_before_closing() -> None:
    events: list[str] = []
    _node(events).close()
    assert events == ["flush", "purge", "pg.close", "log.close"]


def test_a_failing_flush_neither_skips_recovery_and_purge_nor_logs_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []
    node = _node(events, fail=2, ticks=3)
    with caplog.at_level(logging.INFO, logger="nsjms"):
        node._loop()
    assert events.count("recover") == 3 and events.count("purge") == 3, "every tick recovers and purges"
    assert events.count("flush") == 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None, "one warning per run of failures, no traceback"
