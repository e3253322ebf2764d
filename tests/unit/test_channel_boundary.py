"""The channel's servant boundary: store errors and size limits as CORBA system exceptions (no services needed)."""

from __future__ import annotations

import pickle
from typing import Any, ClassVar

import pytest

import omniORB  # noqa: F401  (before the COS stubs)
from omniORB import CORBA

from router.channel.boundary import (
    MINOR_EVENT_TOO_LARGE,
    MINOR_STORE_FAILED,
    MINOR_STORE_TIMEOUT,
    MINOR_STORE_UNAVAILABLE,
    check_size,
    giop_max_msg_size,
    store_boundary,
    store_faults,
)
from router.channel.store import Store, StoreError, StoreUnavailable
from router.db import Database, StoreTimeout


@pytest.mark.parametrize("exc,expected,completed,minor", [
    (StoreUnavailable("down"), CORBA.TRANSIENT, CORBA.COMPLETED_NO, MINOR_STORE_UNAVAILABLE),
    (StoreUnavailable("broke in commit", in_doubt=True), CORBA.TRANSIENT, CORBA.COMPLETED_MAYBE,
     MINOR_STORE_UNAVAILABLE),
    (StoreError("refused"), CORBA.PERSIST_STORE, CORBA.COMPLETED_NO, MINOR_STORE_FAILED),
    (StoreTimeout("statement timeout"), CORBA.TRANSIENT, CORBA.COMPLETED_NO, MINOR_STORE_TIMEOUT),
])
def test_store_faults_become_corba_system_exceptions(exc: Exception, expected: type, completed: Any,
                                                     minor: int) -> None:
    with pytest.raises(expected) as info, store_faults():
        raise exc
    raised: Any = info.value
    assert raised.completed == completed and raised.minor == minor


def test_other_errors_pass_through_untouched() -> None:
    with pytest.raises(ValueError), store_faults():
        raise ValueError("not a store error")


def test_store_unavailable_survives_pickling() -> None:
    back = pickle.loads(pickle.dumps(StoreUnavailable("x", in_doubt=True)))
    assert isinstance(back, StoreUnavailable) and back.in_doubt and str(back) == "x"


def test_size_limit() -> None:
    check_size(100, 100)
    check_size(10**9, 0)                       # 0 = no limit
    with pytest.raises(CORBA.IMP_LIMIT) as info:
        check_size(101, 100)
    assert info.value.minor == MINOR_EVENT_TOO_LARGE and info.value.completed == CORBA.COMPLETED_NO
    assert giop_max_msg_size(8 << 20) > 8 << 20


def test_store_boundary_wraps_only_idl_operations() -> None:
    class Servant:
        _omni_op_d: ClassVar[dict[str, None]] = {"op": None, "missing": None}

        def op(self) -> None:
            raise StoreUnavailable("down")

        def helper(self) -> None:
            raise StoreUnavailable("down")

    store_boundary(Servant)
    store_boundary(Servant)                     # idempotent: wrapped once
    with pytest.raises(CORBA.TRANSIENT):
        Servant().op()
    with pytest.raises(StoreUnavailable):
        Servant().helper()                      # internal callers keep the store's own exception


def test_unreachable_database_is_a_prompt_store_unavailable() -> None:
    db = Database("host=127.0.0.1 port=1 dbname=nsjms user=nobody", checkout_timeout=0.5, connect_timeout=1)
    db._pool.open(wait=False)
    try:
        with pytest.raises(StoreUnavailable) as info, db.unit_of_work() as conn:
            Store().max_seq(conn)
        assert not info.value.in_doubt
        assert "password" not in str(info.value)
    finally:
        db.close()
