"""The credential interceptor checks a presented credential only when the upcall asks who its caller is (issue 27):
a push never pays for the check; a guard sees exactly the caller an eager check gave it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import omniORB
from omniORB import CORBA

from router.security import auth
from router.security.auth import SERVICE_CONTEXT_ID, Authenticator, Principal, Role


@pytest.fixture()
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """An operator token, and the tokens the node's authenticator was asked to check (in order)."""
    token = auth.issue(tmp_path, "ops", Role.OPERATOR).read_text().strip()
    authn = Authenticator(tmp_path)
    checked: list[str] = []
    real = authn.authenticate

    def authenticate(t: str) -> Principal | None:
        checked.append(t)
        return real(t)

    monkeypatch.setattr(authn, "authenticate", authenticate)
    monkeypatch.setitem(auth._server, "installed", True)
    monkeypatch.setitem(auth._server, "auth", authn)
    monkeypatch.setattr(omniORB, "currentCallInfo", lambda: {"peer_address": "giop:tcp:127.0.0.1:1"})
    return token, checked


def _contexts(token: str) -> Any:
    CORBA.ORB_init([], CORBA.ORB_ID)              # cdrMarshal needs an ORB (the process's one, if any)
    return ((SERVICE_CONTEXT_ID, omniORB.cdrMarshal(CORBA.TC_string, token)),)


def test_a_request_that_never_asks_is_not_checked(counted: tuple[str, list[str]]) -> None:
    token, checked = counted
    for _ in range(3):
        auth._receive("push_structured_event", _contexts(token))
    assert checked == []


def test_the_credential_is_checked_once_when_asked(counted: tuple[str, list[str]]) -> None:
    token, checked = counted
    auth._receive("create_bridge", _contexts(token))
    assert auth.current() == Principal("ops", Role.OPERATOR)
    assert auth.require("create_bridge", Role.OPERATOR) == Principal("ops", Role.OPERATOR)
    assert checked == [token]


def test_each_request_has_its_own_caller(counted: tuple[str, list[str]]) -> None:
    token, _ = counted
    auth._receive("create_bridge", _contexts(token))
    assert auth.current() == Principal("ops", Role.OPERATOR)
    auth._receive("create_bridge", ())                       # the next request on this thread: anonymous
    assert auth.current() is None
    with pytest.raises(CORBA.NO_PERMISSION):
        auth.require("create_bridge", Role.READER)
    auth._receive("create_bridge", _contexts(token))        # a credential presented, never asked: then anonymous
    auth._receive("create_bridge", ())
    assert auth.current() is None


def test_an_invalid_credential_is_anonymous_and_logged_without_its_secret(
        counted: tuple[str, list[str]], caplog: pytest.LogCaptureFixture) -> None:
    token, _ = counted
    forged = token.partition(":")[0] + ":not-the-secret"
    auth._receive("create_bridge", _contexts(forged))
    with caplog.at_level(logging.WARNING, logger="nsjms.auth"):
        assert auth.current() is None
    assert "principal 'ops'" in caplog.text and "not-the-secret" not in caplog.text
    auth._receive("create_bridge", ((SERVICE_CONTEXT_ID, b"\x00garbage"),))
    assert auth.current() is None


def test_acting_as_restores_the_requests_caller(counted: tuple[str, list[str]]) -> None:
    token, checked = counted
    auth._receive("create_bridge", _contexts(token))
    with auth.acting_as(Principal("alice", Role.READER)):
        assert auth.current() == Principal("alice", Role.READER)
    assert auth.current() == Principal("ops", Role.OPERATOR)
    assert checked == [token]


def test_the_presented_credential_never_shows_in_a_repr() -> None:
    """The raw token a request presented (its secret included) stays in a thread-local until the thread's next
    request: a ``%r`` in a log line or a debugger's dump of it must not print it (review finding)."""
    from router.security.auth import _Presented

    secret = b"operator:s3cr3t-token-value"
    assert "s3cr3t" not in repr(_Presented("push_structured_event", secret))
