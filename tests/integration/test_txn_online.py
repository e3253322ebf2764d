"""``nsjms txn`` with the router running (online mode): the command asks the node over IIOP
(``NsjmsAdmin::TransactionAdmin``) and acts through the node's own recovery manager. The in-doubt situations are
real prepared PostgreSQL branches in the node's database, made while it runs; ``nsjms status`` shows the count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import Xid

from xa.xid import FORMAT_ID, NodeId, branch_xid, new_gtrid

from bridgekit import prepare_foreign, prepared_gids
from conftest import NsjmsServer, started_node

pytestmark = pytest.mark.integration
NODE = NodeId("node1")


@pytest.fixture
def server(tmp_path: Path, fresh_db: str, broker_url: str) -> Iterator[NsjmsServer]:
    with started_node(tmp_path / "state", fresh_db, broker_url) as s:
        yield s


def cli(server: NsjmsServer, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, NSJMS_POSTGRES_DSN=server.pg_dsn)
    proc = subprocess.run([sys.executable, "-m", "router.cli", *args, "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def listing(server: NsjmsServer) -> dict[str, Any]:
    code, out, err = cli(server, "txn", "list", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def status_line(server: NsjmsServer, wanted: str, timeout: float = 30.0) -> str:
    """``nsjms status`` until its transactions line contains ``wanted`` (the node writes status.json every 2 s)."""
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        code, out, err = cli(server, "status")
        assert code == 0, err
        line = next((x for x in out.splitlines() if x.startswith("transactions")), "")
        if wanted in line:
            return line
        time.sleep(0.5)
    raise AssertionError(f"status never showed {wanted!r}; last: {line!r}")


def test_online_list_resolve_forget_and_status(server: NsjmsServer) -> None:
    dsn = server.pg_dsn
    young = new_gtrid(NODE)
    prepare_foreign(dsn, branch_xid(young, "pg"))
    decide = new_gtrid(NODE)
    prepare_foreign(dsn, branch_xid(decide, "pg"))
    orphan = prepare_foreign(dsn, Xid.from_parts(FORMAT_ID, "hand-made", "outbox"))
    other = prepare_foreign(dsn, branch_xid(new_gtrid(NodeId("other")), "pg"))

    result = listing(server)
    assert result["mode"] == "online"
    by = {t["gtrid"]: t for t in result["transactions"]}
    assert set(by) == {young, decide}
    assert by[young]["action"] == "wait" and "younger than the in-flight guard (60 s)" in by[young]["reason"]
    assert [o["gid"] for o in result["orphans"]] == [orphan] and result["foreign"] == 1

    code, out, err = cli(server, "txn", "rollback", young, "--yes", "--why", "operator test")
    assert code == 0, err
    assert branch_xid(young, "pg").gtrid not in {Xid.from_string(g).gtrid for g in prepared_gids(dsn)}

    code, out, err = cli(server, "txn", "commit", decide, "--yes", "--why", "keep it")
    assert code == 4 and "Add --heuristic" in err, "no COMMIT logged: refused without --heuristic"
    code, out, err = cli(server, "txn", "commit", decide, "--heuristic", "--yes", "--why", "keep it")
    assert code == 0, err
    assert "HEURISTIC" in out
    [view] = listing(server)["transactions"]
    assert (view["gtrid"], view["status"], view["action"]) == (decide, "heuristic-commit", "forget")
    status_line(server, "transactions 1 in doubt (oldest ")

    code, out, err = cli(server, "txn", "recover")
    assert code == 0, err
    assert sorted(prepared_gids(dsn)) == sorted([orphan, other]), "recovery leaves orphans and other nodes alone"

    code, _, err = cli(server, "txn", "forget", decide, "--yes")
    assert code == 0, err
    assert listing(server)["transactions"] == []
    status_line(server, "transactions 0 in doubt")
    audit = (server.state_dir / "txn-operator.log").read_text().splitlines()
    assert [json.loads(x)["action"] for x in audit] == ["rollback", "commit", "heuristic-commit", "recover", "forget"]
    assert {json.loads(x)["mode"] for x in audit} == {"online"}
