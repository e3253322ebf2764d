"""router/security/auth.py and router/node/adminguard.py without a node: credentials, roles, which operations are
guarded."""

from __future__ import annotations

import importlib
import json
import pkgutil
import stat
from pathlib import Path
from typing import Any

import pytest

import omniORB  # noqa: F401
from omniORB import CORBA

import router
from idl.generated import CosBridgeAdmin__POA, NsjmsAdmin__POA
from router.node import adminguard
from router.security import auth
from router.security.auth import Authenticator, Principal, Role


def test_issued_token_authenticates_with_its_role_and_files_are_private(tmp_path: Path) -> None:
    made = auth.ensure_defaults(tmp_path)
    assert made == ["operator", "reader"]
    a = Authenticator(tmp_path)
    op = auth.token_path(tmp_path, "operator").read_text().strip()
    rd = auth.token_path(tmp_path, "reader").read_text().strip()
    assert a.authenticate(op) == Principal("operator", Role.OPERATOR)
    assert a.authenticate(rd) == Principal("reader", Role.READER)
    assert a.authenticate("operator:" + "x" * 43) is None
    assert a.authenticate("nobody:" + op.partition(":")[2]) is None
    assert a.authenticate(op.partition(":")[2]) is None           # a secret without its principal
    assert stat.S_IMODE(auth.credentials_dir(tmp_path).stat().st_mode) == 0o700
    for f in auth.credentials_dir(tmp_path).iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert op.partition(":")[2] not in (auth.credentials_dir(tmp_path) / auth.PRINCIPALS_FILE).read_text()
    assert auth.ensure_defaults(tmp_path) == []                    # kept across restarts


def test_rotation_takes_effect_without_a_restart(tmp_path: Path) -> None:
    auth.ensure_defaults(tmp_path)
    a = Authenticator(tmp_path)
    old = auth.token_path(tmp_path, "operator").read_text().strip()
    assert a.authenticate(old) is not None
    auth.issue(tmp_path, "operator", Role.OPERATOR)
    new = auth.token_path(tmp_path, "operator").read_text().strip()
    assert new != old
    assert a.authenticate(old) is None
    assert a.authenticate(new) == Principal("operator", Role.OPERATOR)


def test_unreadable_principals_refuse_everyone(tmp_path: Path) -> None:
    auth.ensure_defaults(tmp_path)
    op = auth.token_path(tmp_path, "operator").read_text().strip()
    (auth.credentials_dir(tmp_path) / auth.PRINCIPALS_FILE).write_text("{not json")
    assert Authenticator(tmp_path).authenticate(op) is None


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a b", "a:b"])
def test_principal_names_are_checked(tmp_path: Path, name: str) -> None:
    with pytest.raises(auth.AuthError):
        auth.issue(tmp_path, name, Role.READER)


def _all_router_modules() -> None:
    for info in pkgutil.walk_packages(router.__path__, "router."):
        if info.name.startswith("router.cli.demo"):
            continue
        importlib.import_module(info.name)


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _admin_interface(cls: type) -> bool:
    """The project's own IDL (prefix nsjms.org) or NJI's bridge administration."""
    repo_id = str(getattr(cls, "_NP_RepositoryId", ""))
    return repo_id.startswith(("IDL:nsjms.org/", "IDL:omg.org/CosBridgeAdmin/"))


def test_every_admin_servant_is_guarded_whole() -> None:
    """Every servant class in router/ of an interface of the project's own IDL (any module under the nsjms.org
    prefix) or of CosBridgeAdmin is an admin surface, and every IDL operation it implements needs a role: a new
    admin interface or operation is guarded by default."""
    from omniORB import PortableServer

    _all_router_modules()
    adminguard.apply()
    assert NsjmsAdmin__POA and CosBridgeAdmin__POA  # the skeletons are loaded
    servants = {c for c in _subclasses(PortableServer.Servant)
                if c.__module__.startswith("router.") and _admin_interface(c)}
    assert {c.__name__ for c in servants} >= {"TransactionAdminImpl", "BridgeFactoryImpl", "BridgeImpl"}
    for cls in servants:
        assert getattr(cls, "_nsjms_admin_surface", False), f"{cls.__name__}: add it to router/node/adminguard.py"
        for op in auth.idl_operations(cls):
            fn = getattr(cls, op, None)
            if fn is not None:
                assert hasattr(fn, "_nsjms_role"), f"{cls.__name__}.{op} is not guarded"
    from router.bridge.bridge import BridgeImpl

    assert BridgeImpl.destroy._nsjms_role is Role.OPERATOR
    assert BridgeImpl.get_status._nsjms_role is Role.READER


class _Ops:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        self.calls.append((gtrid, action, who, why))
        return {}

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        self.calls.append((gid, action, who, why))
        return {}

    def forget(self, gtrid: str, who: str) -> dict[str, Any]:
        self.calls.append((gtrid, who))
        return {}


def test_operator_log_identity_is_the_principal_not_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.routing.t2.admin import TransactionAdminImpl

    adminguard.apply()
    monkeypatch.setattr(auth, "current", lambda: Principal("ops-bob", Role.OPERATOR))
    ops = _Ops()
    servant = TransactionAdminImpl(ops)  # type: ignore[arg-type]
    servant.resolve("g1", "commit", "alice@ops1", "why")
    servant.resolve_xid("x1", "rollback", "alice@ops1", "why")
    servant.forget("g2", "alice@ops1")
    assert ops.calls == [("g1", "commit", "ops-bob", "why"), ("x1", "rollback", "ops-bob", "why"),
                         ("g2", "ops-bob")]


def test_a_reader_or_anonymous_caller_is_refused_an_operator_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.routing.t2.admin import TransactionAdminImpl

    adminguard.apply()
    ops = _Ops()
    servant = TransactionAdminImpl(ops)  # type: ignore[arg-type]
    for who in (None, Principal("r", Role.READER)):
        monkeypatch.setattr(auth, "current", lambda who=who: who)
        with pytest.raises(CORBA.NO_PERMISSION) as info:
            servant.forget("g", "alice@ops1")
        assert info.value.completed == CORBA.COMPLETED_NO
    assert ops.calls == []


def test_node_threads_are_internal() -> None:
    assert auth.current() is auth.INTERNAL
    assert auth.require("create_bridge", Role.OPERATOR) is auth.INTERNAL


def test_principals_file_shape(tmp_path: Path) -> None:
    auth.install_token(tmp_path, "ci:secret", Role.READER)
    data = json.loads((auth.credentials_dir(tmp_path) / auth.PRINCIPALS_FILE).read_text())
    assert data["principals"]["ci"]["role"] == "reader"
    assert "secret" not in json.dumps(data)


@pytest.mark.parametrize(("count", "limit", "refused"), [(0, 0, False), (10**6, 0, False), (1, 2, False),
                                                          (2, 2, True), (3, 2, True)])
def test_quota_decision(count: int, limit: int, refused: bool) -> None:
    from router.quotas import over

    assert over(count, limit) is refused
