"""router.corbacall: the one boundary for outgoing CORBA calls (classification, retries, expected answers)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from omniORB import CORBA

import CosEventComm
import CosNotifyFilter

from router.corbacall import ADMIN, NOTIFY, CallFailed, CallPolicy, Kind, best_effort, call, classify


class Flaky:
    """A servant stand-in that raises the given exceptions in turn, then answers."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    def match(self, value: Any) -> bool:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return bool(value)


@pytest.mark.parametrize(("exc", "kind"), [
    (CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO), Kind.GONE),
    (CosEventComm.Disconnected(), Kind.GONE),
    (CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), Kind.UNAVAILABLE),
    (CORBA.COMM_FAILURE(0, CORBA.COMPLETED_MAYBE), Kind.UNAVAILABLE),
    (CORBA.TIMEOUT(0, CORBA.COMPLETED_MAYBE), Kind.UNAVAILABLE),
    (CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO), Kind.REFUSED),
    (CORBA.NO_IMPLEMENT(0, CORBA.COMPLETED_NO), Kind.REFUSED),
])
def test_classify(exc: BaseException, kind: Kind) -> None:
    assert classify(exc) is kind


def test_unavailable_is_retried_as_the_policy_says_then_reported() -> None:
    policy = CallPolicy("t", 0, retries=2, backoff_s=0.0)
    target = Flaky(CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), CORBA.TRANSIENT(0, CORBA.COMPLETED_NO))
    assert call(target, "match", 1, policy=policy) is True
    assert target.calls == 3
    target = Flaky(*[CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)] * 3)
    with pytest.raises(CallFailed) as info:
        call(target, "match", 1, policy=policy)
    assert info.value.kind is Kind.UNAVAILABLE and target.calls == 3
    assert isinstance(info.value.cause, CORBA.TRANSIENT)


def test_gone_and_refused_are_not_retried() -> None:
    for exc, kind in ((CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO), Kind.GONE),
                      (CORBA.MARSHAL(0, CORBA.COMPLETED_NO), Kind.REFUSED)):
        target = Flaky(exc)
        with pytest.raises(CallFailed) as info:
            call(target, "match", 1, policy=ADMIN)
        assert info.value.kind is kind and target.calls == 1


def test_expected_user_exceptions_pass_unchanged() -> None:
    target = Flaky(CosNotifyFilter.UnsupportedFilterableData())
    with pytest.raises(CosNotifyFilter.UnsupportedFilterableData):
        call(target, "match", 1, policy=NOTIFY, expected=(CosNotifyFilter.UnsupportedFilterableData,))
    target = Flaky(CosNotifyFilter.UnsupportedFilterableData())
    with pytest.raises(CallFailed) as info:
        call(target, "match", 1, policy=NOTIFY)
    assert info.value.kind is Kind.REFUSED


def test_a_stop_during_the_backoff_ends_the_retries() -> None:
    stop = threading.Event()
    stop.set()
    target = Flaky(*[CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)] * 5)
    with pytest.raises(CallFailed):
        call(target, "match", 1, policy=CallPolicy("t", 0, retries=4, backoff_s=10.0), stop=stop)
    assert target.calls == 1


def test_best_effort_logs_and_reports(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "nsjms.corba")
    assert best_effort(Flaky(), "match", 1, policy=NOTIFY, what="x") is True
    assert best_effort(Flaky(CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)), "match", 1, policy=NOTIFY,
                       what="acknowledge to the supplier") is False
    assert "acknowledge to the supplier: match (notify) failed: unavailable: TRANSIENT" in caplog.text
