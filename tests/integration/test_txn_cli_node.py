"""``nsjms txn`` with the router stopped (offline mode) over real in-doubt situations: real prepared PostgreSQL
branches with this node's xids and the node's real recovery log, left by a "process" that died at a protocol step
(a BaseException the coordinator does not catch), an orphan, another node's xid and another database's. Each is
listed as JSON with its safe action, resolved with the CLI, and checked in ``pg_prepared_xacts`` and at the broker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import Xid, sql
from psycopg.conninfo import make_conninfo

from router.cli import main
from router.db import Database
from router.jms.transport import open_transport
from router.mapping.stomp_codec import StompCodec
from router.node.lifecycle import StateLock
from router.routing.t2.ops import AUDIT_FILE
from router.routing.t2.transactions import NodeTransactions, OutboxRow, outbox_insert
from xa.pg import PgBranch
from xa.xid import FORMAT_ID, NodeId, branch_xid, dedupe_id, new_gtrid

from bridgekit import prepare_foreign, prepared_gids, row_count
from t2kit import Crash, SendBranch

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path, fresh_db: str, broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    monkeypatch.setenv("NSJMS_POSTGRES_DSN", fresh_db)
    monkeypatch.setenv("NSJMS_BROKER_URL", broker_url)
    monkeypatch.setenv("NSJMS_NODE_NODE_ID", "n1")
    database = Database(fresh_db, 2)
    database.open()  # the schema (outbox, inbox) as the node has it
    yield database
    database.close()


def txn(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["txn", *args, "--state-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    return code, out, err


def listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = txn(tmp_path, capsys, "list", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def died(tmp_path: Path, db: Database, dsn: str, queue: str, n: int, *, decided: bool,
         at_broker: bool = False) -> str:
    """A T2 with ``n`` outbox rows in its PostgreSQL branch that died after the COMMIT record was durable
    (``decided``; with ``at_broker`` once PostgreSQL committed, at the broker commit) or after PREPARE, before the
    decision."""
    node = NodeTransactions("n1", tmp_path, db, dsn)
    t = node.coordinator.begin(30)
    with db.branch() as conn:
        branch = PgBranch(conn, "pg")
        t.enlist(branch)
        outbox_insert(conn, [OutboxRow(t.gtrid, i, dedupe_id(t.gtrid, i), 7, f"/queue/{queue}",
                                       {"nsjms_dedupe_id": dedupe_id(t.gtrid, i), "persistent": "true"},
                                       f"m{i}".encode()) for i in range(n)])
        if decided:
            def crash() -> None:
                raise Crash("after the decision, before committing PostgreSQL")
            if not at_broker:
                branch.commit = crash  # type: ignore[method-assign]
            t.enlist(SendBranch(crash="at the broker commit, PostgreSQL committed"))
            with pytest.raises(Crash):
                t.commit()
        else:
            branch.prepare()
    node.pg.close()
    node.log.close()
    return t.gtrid


def receive(broker_url: str, queue: str, want: int) -> list[Any]:
    t = open_transport(broker_url, codec=StompCodec())
    t.connect()
    try:
        sub = t.subscribe(f"/queue/{queue}")
        got: list[Any] = []
        while len(got) < want:
            d = sub.receive(10.0)
            assert d is not None, f"only {len(got)} of {want} messages arrived"
            t.ack(d)
            got.append(d)
        assert sub.receive(0.5) is None, "more messages than expected"
        return got
    finally:
        t.close()


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / AUDIT_FILE).read_text().splitlines()]


def test_logged_commit_is_listed_refused_a_rollback_and_committed_with_its_resend(
        tmp_path: Path, env: Database, fresh_db: str, broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    queue = f"txn.{uuid.uuid4().hex[:8]}"
    gtrid = died(tmp_path, env, fresh_db, queue, 2, decided=True)
    assert len(prepared_gids(fresh_db)) == 1

    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["gtrid"], view["status"], view["decision"], view["action"]) == (gtrid, "commit-logged", "commit",
                                                                                 "commit")
    assert [(b["name"], b["state"]) for b in view["branches"]] == [("pg", "prepared"), ("stomp", "not-confirmed")]
    assert "COMMIT logged; prepared branches pg must be committed" in view["reason"]
    code, out, _ = txn(tmp_path, capsys, "list")
    assert code == 0 and gtrid in out and "router stopped" in out and "commit-logged" in out

    code, _, err = txn(tmp_path, capsys, "rollback", gtrid, "--yes", "--why", "try")
    assert code == 4 and "the decision COMMIT is logged" in err and "Safe action: commit" in err
    assert len(prepared_gids(fresh_db)) == 1, "a refused rollback touches nothing"

    code, out, err = txn(tmp_path, capsys, "commit", gtrid, "--yes", "--why", "runbook step 2", "--who", "ops")
    assert code == 0, err
    assert prepared_gids(fresh_db) == []
    got = receive(broker_url, queue, 2)
    assert [d.headers["nsjms_dedupe_id"] for d in got] == [dedupe_id(gtrid, 0), dedupe_id(gtrid, 1)]
    assert listing(tmp_path, capsys)["transactions"] == []
    entries = audit(tmp_path)
    assert [e["action"] for e in entries] == ["rollback", "commit"]
    assert entries[0]["result"].startswith("refused:") and entries[1]["who"] == "ops"
    assert entries[1]["why"] == "runbook step 2" and entries[1]["result"]["resent"] == [f"{gtrid}/stomp"]


def test_broker_commit_unknown_is_listed_as_resend_and_recover_resends(
        tmp_path: Path, env: Database, fresh_db: str, broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    queue = f"txn.{uuid.uuid4().hex[:8]}"
    gtrid = died(tmp_path, env, fresh_db, queue, 3, decided=True, at_broker=True)
    assert prepared_gids(fresh_db) == [] and row_count(fresh_db, "nsjms_outbox") == 3
    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["status"], view["action"]) == ("commit-logged", "resend")
    assert [(b["name"], b["state"]) for b in view["branches"]] == [("pg", "gone"), ("stomp", "not-confirmed")]
    assert "broker outcome unknown: re-send the outbox rows with their dedupe ids" in view["reason"]
    assert f"re-sends carry dedupe ids {gtrid}/0..{gtrid}/2" in view["reason"]
    assert [r["dedupe_id"] for r in view["outbox"]] == [dedupe_id(gtrid, i) for i in range(3)]
    assert view["events"] == 3 and view["bridges"] == [7] and view["destinations"] == [f"/queue/{queue}"]
    code, out, err = txn(tmp_path, capsys, "recover")
    assert code == 0, err
    assert f"resent {gtrid}/stomp" in out and f"ended {gtrid}" in out
    got = receive(broker_url, queue, 3)
    assert [d.headers["nsjms_dedupe_id"] for d in got] == [dedupe_id(gtrid, i) for i in range(3)]
    assert listing(tmp_path, capsys)["transactions"] == []


def test_undecided_branch_is_presumed_abort_and_rolled_back(
        tmp_path: Path, env: Database, fresh_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    gtrid = died(tmp_path, env, fresh_db, "unused", 1, decided=False)
    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["status"], view["decision"], view["action"]) == ("undecided", None, "rollback")
    assert view["reason"] == ("no COMMIT logged: presumed abort (the node is stopped: nothing can be deciding it)")
    code, _, err = txn(tmp_path, capsys, "rollback", gtrid, "--yes", "--why", "presumed abort")
    assert code == 0, err
    assert prepared_gids(fresh_db) == [] and row_count(fresh_db, "nsjms_outbox") == 0


def test_operator_commit_without_a_decision_is_a_heuristic_until_forgotten(
        tmp_path: Path, env: Database, fresh_db: str, broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    queue = f"txn.{uuid.uuid4().hex[:8]}"
    gtrid = died(tmp_path, env, fresh_db, queue, 1, decided=False)
    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["events"], view["events_known"]) == (0, False), "its outbox rows cannot be read: not 'events 0'"
    code, out, _ = txn(tmp_path, capsys, "list")
    assert f"{gtrid}  undecided" in out and "  ?  " in out
    code, out, err = txn(tmp_path, capsys, "commit", gtrid, "--yes", "--why", "the data is needed")
    assert code == 4 and "Add --heuristic" in err and "an unknown number of events" in err
    assert len(prepared_gids(fresh_db)) == 1, "refused: nothing done"
    code, out, err = txn(tmp_path, capsys, "commit", gtrid, "--heuristic", "--yes", "--why", "the data is needed")
    assert code == 0, err
    assert "HEURISTIC" in out and f"resent {gtrid}/broker" in out
    assert prepared_gids(fresh_db) == [] and row_count(fresh_db, "nsjms_outbox") == 1
    [got] = receive(broker_url, queue, 1)
    assert got.headers["nsjms_dedupe_id"] == dedupe_id(gtrid, 0), "its committed outbox row is re-sent"
    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["status"], view["action"]) == ("heuristic-commit", "forget")
    assert view["heuristics"][0]["why"] == "the data is needed"
    code, _, err = txn(tmp_path, capsys, "rollback", gtrid, "--yes", "--why", "undo")
    assert code == 4 and "committed heuristically by" in err and "nothing left to roll back" in err
    assert [(e["action"], str(e["result"])[:8]) for e in audit(tmp_path)] == [
        ("commit", "refused:"), ("heuristic-commit", "{'action"), ("rollback", "refused:")]
    code, _, err = txn(tmp_path, capsys, "recover")
    assert code == 0, err
    assert len(listing(tmp_path, capsys)["transactions"]) == 1, "recovery never forgets a heuristic outcome"
    code, _, err = txn(tmp_path, capsys, "forget", gtrid, "--yes")
    assert code == 0, err
    assert listing(tmp_path, capsys)["transactions"] == []


@pytest.fixture
def other_db(pg_dsn: str) -> Iterator[str]:
    name = f"nsjms_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(pg_dsn, dbname=name)
    yield dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        for gid in prepared_gids(dsn):
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_orphans_other_nodes_and_other_databases(tmp_path: Path, env: Database, fresh_db: str, other_db: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    orphan = prepare_foreign(fresh_db, Xid.from_parts(FORMAT_ID, "hand-made", "outbox"))
    other_gtrid = new_gtrid(NodeId("n2"))
    other_node = prepare_foreign(fresh_db, branch_xid(other_gtrid, "pg"))
    elsewhere = prepare_foreign(other_db, branch_xid(new_gtrid(NodeId("n1")), "pg"))

    code, _, err = txn(tmp_path, capsys, "recover")
    assert code == 0, err
    assert sorted(prepared_gids(fresh_db)) == sorted([orphan, other_node]) and prepared_gids(other_db) == [elsewhere]

    result = listing(tmp_path, capsys)
    assert result["transactions"] == [] and result["foreign"] == 1
    assert [(o["gid"], o["gtrid"], o["bqual"]) for o in result["orphans"]] == [(orphan, "hand-made", "outbox")]
    code, out, _ = txn(tmp_path, capsys, "list")
    assert "orphaned prepared branches (1; never touched without --xid GID)" in out
    assert "1 prepared transaction(s) of other nodes or applications ignored" in out

    code, _, err = txn(tmp_path, capsys, "rollback", other_gtrid, "--yes", "--why", "no")
    assert code == 4 and "no transaction" in err
    code, _, err = txn(tmp_path, capsys, "rollback", "--xid", other_node, "--yes", "--why", "no")
    assert code == 4 and "another node or application" in err
    refused = audit(tmp_path)                       # every operator action, refused or done, is in the log
    assert [(e["action"], e["target"], str(e["result"])[:8]) for e in refused[-2:]] == [
        ("rollback", other_gtrid, "refused:"), ("rollback --xid", other_node, "refused:")]
    code, _, err = txn(tmp_path, capsys, "rollback", "--xid", orphan, "--yes", "--why", "checked: empty")
    assert code == 0, err
    assert prepared_gids(fresh_db) == [other_node] and prepared_gids(other_db) == [elsewhere]
    [view] = listing(tmp_path, capsys)["transactions"]
    assert (view["gtrid"], view["status"], view["action"]) == ("hand-made", "heuristic-rollback", "forget")
    code, _, err = txn(tmp_path, capsys, "forget", "hand-made", "--yes")
    assert code == 0, err
    assert listing(tmp_path, capsys)["transactions"] == []


def test_the_state_lock_is_taken_and_confirmation_required(tmp_path: Path, env: Database, fresh_db: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    gtrid = died(tmp_path, env, fresh_db, "unused", 1, decided=False)
    code, _, err = txn(tmp_path, capsys, "rollback", gtrid, "--why", "x")
    assert code == 2 and "add --yes" in err
    assert len(prepared_gids(fresh_db)) == 1
    lock = StateLock(tmp_path)
    lock.acquire()
    try:
        code, _, err = txn(tmp_path, capsys, "list")
        assert code == 5 and "in use by a running nsjms node" in err
    finally:
        lock.release()


def test_an_endpoints_file_left_by_a_killed_node_does_not_prevent_offline_mode(
        tmp_path: Path, env: Database, fresh_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    gtrid = died(tmp_path, env, fresh_db, "unused", 1, decided=False)
    (tmp_path / "endpoints.json").write_text(json.dumps({"node_id": "n1", "pid": 999999}))  # SIGKILLed node's file
    result = listing(tmp_path, capsys)
    assert result["mode"] == "offline" and [t["gtrid"] for t in result["transactions"]] == [gtrid]


def test_a_wrong_node_id_is_named_instead_of_showing_nothing(
        tmp_path: Path, env: Database, fresh_db: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    died(tmp_path, env, fresh_db, "unused", 1, decided=True)
    monkeypatch.setenv("NSJMS_NODE_NODE_ID", "typo")
    code, _, err = txn(tmp_path, capsys, "recover")
    assert code == 2 and "no recovery log of node typo" in err and "xa-n1.log" in err
    assert not (tmp_path / "xa-typo.log").exists()


def test_node_depths_count_the_outbox_and_estimate_the_inbox(tmp_path: Path, env: Database, fresh_db: str) -> None:
    import time

    from router.routing.t2.transactions import inbox_claim

    died(tmp_path, env, fresh_db, "unused", 2, decided=True, at_broker=True)  # 2 committed outbox rows
    with env.unit_of_work() as conn:
        inbox_claim(conn, 1, [f"ID:{i}" for i in range(5)], "g")
    node = NodeTransactions("n1", tmp_path, env, fresh_db)
    try:
        deadline = time.monotonic() + 30  # the statistics reach pg_stat_user_tables asynchronously
        while (depths := node.depths()) != {"outbox": 2, "inbox": 5} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert depths == {"outbox": 2, "inbox": 5}
    finally:
        node.pg.close()
        node.log.close()
