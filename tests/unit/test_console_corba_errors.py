"""The node's CORBA exceptions in the console (issue 26): a quota's ``IMP_LIMIT``, ``NO_PERMISSION``, ``TRANSIENT``,
``COMM_FAILURE`` and the specs' user exceptions are refusals an operator can read (409) or "node not reachable"
(503), in the words the CLI prints for them (:func:`router.cli.out.corba_error`), recorded and logged.

The console's real backend (:class:`router.console.backend.NodeBackend`) runs over a stand-in node whose
``EventChannelFactory`` and ``BridgeFactory`` raise what a real node raises; the CLI's words are taken from
:func:`router.cli.out.run_handler` with a handler that meets the same exception.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flask.testing import FlaskClient

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin

from router.cli.out import corba_error, run_handler
from router.console.app import create_app
from router.console.backend import NodeBackend, NodeRefused, NodeUnavailable
from router.security.auth import Principal, Role, issue


class Raises:
    """A node object whose every operation raises ``exc`` (and which narrows to itself)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def _narrow(self, _type: Any) -> Raises:
        return self

    def __getattr__(self, name: str) -> Any:
        def operation(*_args: Any) -> Any:
            raise self.exc
        return operation


class Ops:
    def __init__(self) -> None:
        self.audits: list[tuple[Any, ...]] = []

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        self.audits.append((who, why, action, target, result))


def node(state_dir: Path, exc: Exception) -> Any:
    ref = SimpleNamespace(ref=Raises(exc))
    return SimpleNamespace(s=SimpleNamespace(state_dir=state_dir), txn_admin=SimpleNamespace(ops=Ops()),
                           factory=ref, bridges=ref)


def cli_words(exc: Exception, command: str = "channel") -> tuple[int, str]:
    """What ``nsjms COMMAND`` prints (stderr, without its ``nsjms COMMAND: `` prefix) and its exit code."""
    def handler(_args: argparse.Namespace, _cfg: Any) -> int:
        raise exc
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run_handler(handler, argparse.Namespace(command=command, json=False), None)
    return code, err.getvalue().strip().removeprefix(f"nsjms {command}: ")


def signed_in(tmp_path: Path, exc: Exception) -> tuple[Ops, FlaskClient, str]:
    secret = issue(tmp_path, "operator", Role.OPERATOR).read_text().strip().partition(":")[2]
    stand_in = node(tmp_path, exc)
    client = create_app(NodeBackend(stand_in)).test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").get_data(as_text=True))
    assert token
    client.post("/login", data={"csrf": token.group(1), "name": "operator", "secret": secret, "next": "/"})
    page = client.get("/audit").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf
    return stand_in.txn_admin.ops, client, csrf.group(1)


QUOTA = CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)                                  # router/quotas.py
GUARD = CORBA.NO_PERMISSION(0, CORBA.COMPLETED_NO)                              # router/security/auth.py require()
PROXY_LIMIT = CosNotifyChannelAdmin.AdminLimitExceeded(CosNotification.Property("nsjms.MaxProxies", None))


@pytest.mark.parametrize(("exc", "status", "words"), [
    (QUOTA, 409, "the node holds its limit of channels, admins, proxies or bridges"),
    (GUARD, 409, "not authorised (the node refused this credential"),
    (PROXY_LIMIT, 409, "refused by the node: CosNotifyChannelAdmin::AdminLimitExceeded"),
    (CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), 503, "node not reachable: TRANSIENT"),
    (CORBA.COMM_FAILURE(0, CORBA.COMPLETED_MAYBE), 503, "node not reachable: COMM_FAILURE"),
], ids=["IMP_LIMIT", "NO_PERMISSION", "user exception", "TRANSIENT", "COMM_FAILURE"])
def test_channel_create_refused_by_the_node_in_the_clis_words(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              exc: Exception, status: int, words: str) -> None:
    """It was a bare 500 (the exception escaped Flask's handlers) and nothing in the operator log."""
    ops, client, csrf = signed_in(tmp_path, exc)
    code, cli = cli_words(exc)
    assert code == (3 if status == 503 else 4) and words in cli
    with caplog.at_level(logging.WARNING, logger="nsjms.console"):
        resp = client.post("/channels/create", data={"csrf": csrf, "why": "more room", "qos": "", "admin": ""})
    assert resp.status_code == status
    page = resp.get_data(as_text=True)
    assert cli.replace("'", "&#39;").replace('"', "&#34;") in page, (cli, page)
    assert ops.audits[-1][:4] == ("operator", "more room", "console channel create", "defaults")
    assert ops.audits[-1][4] == cli                                      # recorded in the CLI's words
    assert any(cli in r.getMessage() and str(status) in r.getMessage() for r in caplog.records)
    resp = client.post("/channels/create?format=json", data={"csrf": csrf, "why": "x"})
    assert resp.status_code == status and resp.get_json() == {"error": cli}


def test_a_quota_refusal_of_a_bridge_action_and_a_selection(tmp_path: Path) -> None:
    ops, client, csrf = signed_in(tmp_path, QUOTA)
    resp = client.post("/bridges/3/start?format=json", data={"csrf": csrf, "why": "go"})
    assert resp.status_code == 409 and resp.get_json()["error"] == cli_words(QUOTA, "bridge")[1]
    assert ops.audits[-1][2:] == ("console bridge start", "3", cli_words(QUOTA, "bridge")[1])
    resp = client.post("/bridges/selected?format=json", data={"csrf": csrf, "why": "go", "action": "stop",
                                                              "ids": ["3", "4"]})
    assert resp.status_code == 200
    assert [(r["id"], r["ok"], r["result"]) for r in resp.get_json()["results"]] == [
        (3, False, cli_words(QUOTA, "bridge")[1]), (4, False, cli_words(QUOTA, "bridge")[1])]


@pytest.mark.parametrize(("exc", "status"), [(CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), 503), (GUARD, 409)])
def test_reading_pages_of_a_node_that_fails(tmp_path: Path, exc: Exception, status: int) -> None:
    """A list or an item page: 503 when the node does not answer, 409 when it refuses, never 500 nor 404."""
    _, client, _ = signed_in(tmp_path, exc)
    for path in ("/channels", "/channels/1", "/bridges", "/bridges/1"):
        resp = client.get(path)
        assert resp.status_code == status, path
        assert cli_words(exc)[1].replace("'", "&#39;") in resp.get_data(as_text=True), path


def test_the_translation_is_one_function() -> None:
    assert corba_error(ValueError("x")) is None
    refused = corba_error(CORBA.INTERNAL(7, CORBA.COMPLETED_MAYBE))
    assert refused is not None and not refused.unavailable and refused.exit_code == 4
    assert refused.words == ("refused: the node failed the request (minor code 7): CORBA.INTERNAL, it may have been "
                             "done: check before retrying")
    assert issubclass(NodeRefused, Exception) and NodeUnavailable.status == 503 and NodeRefused.status == 409


def test_an_orphans_refusal_is_the_clis(tmp_path: Path) -> None:
    """``orphan_action`` is ``TxnOps.resolve_xid`` (``nsjms txn commit|rollback --xid``): its refusal, its words."""
    from router.console.backend import ConsoleRefused
    from router.routing.t2.ops import Refused

    class XidOps(Ops):
        def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
            self.audits.append((who, why, f"{action} --xid", gid, "refused"))
            raise Refused(f"{gid} belongs to another node or application: nsjms never touches it")

    stand_in = node(tmp_path, QUOTA)
    stand_in.txn_admin.ops = XidOps()
    backend = NodeBackend(stand_in)
    with pytest.raises(ConsoleRefused, match="nsjms never touches it"):
        backend.orphan_action(Principal("op", Role.OPERATOR), "g1", "commit", "checked")
    with pytest.raises(ConsoleRefused, match="committed or rolled back, not 'forget'"):
        backend.orphan_action(Principal("op", Role.OPERATOR), "g1", "forget", "checked")
    assert stand_in.txn_admin.ops.audits == [("op", "checked", "commit --xid", "g1", "refused")]


def test_node_calls_are_counted_per_request_thread() -> None:
    from router.console import calls

    class Factory:
        def _narrow(self, _type: Any) -> Factory:
            return self

        def get_all_bridges(self) -> list[int]:
            return [1, 2]

    calls.reset()
    counted = calls.Counted(Factory())
    counted._narrow(None)                                                # not an operation
    assert counted.get_all_bridges() == [1, 2] and counted.get_all_bridges() == [1, 2]
    assert calls.taken() == 2
    calls.reset()
    assert calls.taken() == 0


def test_the_status_snapshot_is_parsed_once_per_version(tmp_path: Path) -> None:
    import json
    import os

    backend = NodeBackend(node(tmp_path, QUOTA))
    assert backend.snapshot() == {}
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"bridges": [{"id": 1}]}))
    first = backend.snapshot()
    assert first == {"bridges": [{"id": 1}]} and backend.snapshot() is first       # not parsed again
    tmp = tmp_path / "status.json.tmp"
    tmp.write_text(json.dumps({"bridges": [{"id": 1}, {"id": 2}]}))
    os.replace(tmp, path)                                                           # as the node rewrites it
    assert backend.snapshot() == {"bridges": [{"id": 1}, {"id": 2}]}
