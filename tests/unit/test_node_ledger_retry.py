"""A failed ledger maintenance pass is retried within a minute, also the start's (router/node/watches.py)."""

from __future__ import annotations

from types import SimpleNamespace

from router.node.watches import LEDGER_RETRY_S, NodeWatches


class _Stop:
    """``shutting_down``: records each wait, says "stopping" after ``waits`` of them."""

    def __init__(self, waits: int) -> None:
        self.waits: list[float] = []
        self.left = waits

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        self.left -= 1
        return self.left < 0


class _Node(NodeWatches):
    def __init__(self, outcomes: list[bool], waits: int) -> None:
        self.s = SimpleNamespace(ledger=SimpleNamespace(maintenance_interval_s=3600.0))
        self.runtime = SimpleNamespace(shutting_down=_Stop(waits))
        self.outcomes = outcomes

    def maintain_ledger(self) -> bool:
        return self.outcomes.pop(0)


def test_a_failed_start_pass_is_retried_within_a_minute_then_the_period_resumes() -> None:
    node = _Node([False, True, True], waits=3)
    node._ledger_loop(False)
    assert node.runtime.shutting_down.waits == [LEDGER_RETRY_S, LEDGER_RETRY_S, 3600.0, 3600.0]


def test_a_start_pass_that_worked_waits_a_whole_period() -> None:
    node = _Node([True], waits=1)
    node._ledger_loop(True)
    assert node.runtime.shutting_down.waits == [3600.0, 3600.0]
