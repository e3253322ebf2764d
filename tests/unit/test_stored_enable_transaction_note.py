"""The load-time rule for a stored EnableTransaction = TRUE without this version's own-flag record
(router.channel.admins.stored_enable_transaction_note; docs/qos.md "Stored values"). The node-level test is
tests/integration/test_stored_enable_transaction.py."""

from __future__ import annotations

from typing import Any

import pytest

from router.channel import qos as Q
from router.channel.admins import stored_enable_transaction_note
from router.channel.txdelivery import OWN_ENABLE_TRANSACTION


def _proxy(side: str, style: str, *, qos: dict[str, Any], extra: dict[str, Any] | None = None,
           admin_qos: dict[str, Any] | None = None, t2: bool = True, ack: bool = False) -> Any:
    proxy: Any = type("Proxy", (), {"acknowledging": ack})()
    proxy.side, proxy.style, proxy.qos, proxy.extra = side, style, qos, extra or {}
    proxy.rt = type("Rt", (), {"t2": object() if t2 else None})()
    proxy.admin = type("Admin", (), {"qos": admin_qos or {}})()
    proxy.channel = type("Channel", (), {"qos": {}})()
    return proxy


ON = {Q.ENABLE_TRANSACTION: True}


@pytest.mark.parametrize(("side", "style", "ack", "t2", "why"), [
    ("C", "PULL", False, True, "pull proxy supplier"),
    ("C", "PUSH", True, True, "acknowledging proxy supplier"),
    ("S", "PUSH", False, True, "push-style proxy consumer"),
    ("C", "PUSH", False, False, "no routing transactions"),
])
def test_a_proxy_that_can_never_run_a_t2_says_its_stored_true_is_ignored(side: str, style: str, ack: bool, t2: bool,
                                                                          why: str) -> None:
    legacy = stored_enable_transaction_note(_proxy(side, style, qos=ON, ack=ack, t2=t2))
    assert legacy is not None and why in legacy and "older nsjms version" in legacy
    assert "delivers without a routing transaction" in legacy
    inherited = stored_enable_transaction_note(_proxy(side, style, qos=ON, ack=ack, t2=t2, admin_qos=ON))
    assert inherited is not None and "inherited" in inherited and why in inherited


def test_an_older_versions_true_on_a_proxy_that_can_run_a_t2_is_announced_as_honoured_from_now_on() -> None:
    note = stored_enable_transaction_note(_proxy("C", "PUSH", qos=ON))
    assert note is not None and "older nsjms version" in note and "honoured from now on" in note
    assert stored_enable_transaction_note(_proxy("S", "PULL", qos=ON)) is not None


@pytest.mark.parametrize("extra", [{OWN_ENABLE_TRANSACTION: True}, {OWN_ENABLE_TRANSACTION: False}])
def test_nothing_to_say_for_a_value_this_version_checked_or_an_inherited_one_that_can_run(
        extra: dict[str, Any]) -> None:
    assert stored_enable_transaction_note(_proxy("C", "PULL", qos=ON, extra=extra)) is None
    assert stored_enable_transaction_note(_proxy("C", "PUSH", qos=ON, admin_qos=ON)) is None
    assert stored_enable_transaction_note(_proxy("C", "PULL", qos={})) is None
