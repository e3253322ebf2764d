"""``nsjms txn`` decisions without services: confirmation on a terminal, --yes, --why, refusals and exit codes,
filters, over a fake backend; and that the online operations share the node's recovery lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from router.cli import build_parser
from router.cli import txn as txncli
from router.routing.t2.admin import node_ops

VIEW: dict[str, Any] = {
    "gtrid": "n1:000000000001000000000001", "status": "undecided", "decision": None, "decided_at": None,
    "deadline": None, "age_s": 120.0, "action": "rollback", "reason": "no COMMIT logged: presumed abort",
    "branches": [{"name": "pg", "kind": "postgresql", "one_phase": False, "state": "prepared", "prepared_at": 1.0}],
    "outbox": [], "inbox": [], "heuristics": [], "bridges": [], "destinations": [], "events": 0, "in_doubt": True,
}


class Fake:
    mode = "offline"

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.refuse = ""

    def listing(self) -> dict[str, Any]:
        young = dict(VIEW, gtrid="n1:000000000002000000000002", age_s=5.0, action="wait", in_doubt=False)
        return {"node": "n1", "mode": self.mode, "time": 0.0, "transactions": [dict(VIEW), young], "orphans": [],
                "foreign": 0, "errors": []}

    def show(self, gtrid: str) -> dict[str, Any]:
        return dict(VIEW, gtrid=gtrid)

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        if self.refuse:
            raise txncli.Refusal(self.refuse)
        if action == "commit" and self.show(gtrid)["decision"] is None:   # as router.routing.t2.view.refusal does
            self.calls.append(("refused " + action, gtrid, who, why))
            raise txncli.Refusal(f"{gtrid}: no COMMIT is logged: ... Add --heuristic to commit it")
        self.calls.append((action, gtrid, who, why))
        return {"gtrid": gtrid, "action": action, "rolled_back": [f"{gtrid}/pg"], "errors": [], "heuristic": False}

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        self.calls.append((f"{action} --xid", gid, who, why))
        return {"gid": gid, "action": action, "heuristic": True}

    def forget(self, gtrid: str, who: str) -> dict[str, Any]:
        self.calls.append(("forget", gtrid, who))
        return {"gtrid": gtrid, "forgotten": True}

    def recover(self) -> dict[str, Any]:
        return {"committed": [], "rolled_back": [], "resent": [], "ended": [], "errors": ["pg: down"]}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    backend = Fake()

    @contextmanager
    def use(cfg: Any, *, write: bool) -> Iterator[Fake]:
        yield backend

    monkeypatch.setattr(txncli, "backend", use)
    return backend


def run(argv: list[str], *, answers: list[str] | None = None, tty: bool = True) -> tuple[int, list[str], list[str]]:
    args = build_parser().parse_args(["txn", *argv])
    for key, default in {"state_dir": None, "config": None, "json": False}.items():
        if not hasattr(args, key):
            setattr(args, key, default)
    out: list[str] = []
    err: list[str] = []
    queue = list(answers or [])
    code = txncli.run(args, None, out=out.append, err=err.append, ask=lambda prompt: queue.pop(0), tty=tty)
    return code, out, err


def test_rollback_asks_on_a_terminal_and_does_nothing_without_yes(fake: Fake) -> None:
    code, _, err = run(["rollback", VIEW["gtrid"], "--why", "x"], answers=["no"])
    assert code == 4 and fake.calls == [] and err[-1] == "nothing done"
    assert "safe action ROLLBACK: no COMMIT logged: presumed abort" in err[0]
    code, out, _ = run(["rollback", VIEW["gtrid"], "--why", "x", "--who", "me"], answers=["yes"])
    assert code == 0 and fake.calls == [("rollback", VIEW["gtrid"], "me", "x")]
    assert out == [f"{VIEW['gtrid']} (offline): rolled back {VIEW['gtrid']}/pg"]


def test_without_a_terminal_yes_and_why_are_required(fake: Fake) -> None:
    code, _, err = run(["rollback", VIEW["gtrid"], "--why", "x"], tty=False)
    assert code == 2 and "add --yes" in err[0] and fake.calls == []
    code, _, err = run(["rollback", VIEW["gtrid"], "--yes"], tty=False)
    assert code == 2 and "--why is required" in err[0]
    code, _, _ = run(["rollback", VIEW["gtrid"], "--yes", "--why", "x"], tty=False)
    assert code == 0 and len(fake.calls) == 1


def test_why_is_asked_for_on_a_terminal(fake: Fake) -> None:
    code, _, _ = run(["rollback", VIEW["gtrid"]], answers=["because", "yes"])
    assert code == 0 and fake.calls[0][3] == "because"


def test_acting_against_the_safe_action_warns_of_a_heuristic_outcome(fake: Fake) -> None:
    code, _, err = run(["commit", VIEW["gtrid"], "--why", "x", "--heuristic"], answers=["no"])
    assert code == 4 and "WARNING: no COMMIT is logged (safe action 'rollback'): committing is a HEURISTIC" in err[0]
    assert "it commits 0 event(s) and re-sends its outbox rows with their dedupe ids" in err[0]
    assert fake.calls == []
    code, _, _ = run(["commit", VIEW["gtrid"], "--why", "x", "--heuristic", "--who", "me"], answers=["yes"])
    assert code == 0 and fake.calls == [("heuristic-commit", VIEW["gtrid"], "me", "x")]


def test_a_commit_without_a_decision_is_refused_without_heuristic_and_asks_nothing(fake: Fake) -> None:
    code, _, err = run(["commit", VIEW["gtrid"], "--why", "x", "--who", "me"], answers=[])
    assert code == 4 and "Add --heuristic" in err[-1]
    assert fake.calls == [("refused commit", VIEW["gtrid"], "me", "x")], "the backend refuses it (and logs it)"


def test_rolling_back_what_may_still_be_deciding_is_noted_not_called_heuristic(fake: Fake,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    young = dict(VIEW, action="wait", reason="no decision yet; younger than the in-flight guard (60 s)")
    monkeypatch.setattr(fake, "show", lambda gtrid: young)
    code, _, err = run(["rollback", VIEW["gtrid"], "--why", "x"], answers=["no"])
    assert code == 4 and "NOTE: the safe action is 'wait': no decision yet; younger than" in err[0]
    assert "HEURISTIC" not in err[0]


def test_a_refusal_is_exit_4_with_the_reason(fake: Fake) -> None:
    fake.refuse = "the decision COMMIT is logged"
    code, _, err = run(["rollback", VIEW["gtrid"], "--yes", "--why", "x"])
    assert code == 4 and err == ["nsjms txn rollback: refused: the decision COMMIT is logged"]


def test_gtrid_or_xid_not_both(fake: Fake) -> None:
    assert run(["commit", "--yes", "--why", "x"])[0] == 2
    assert run(["commit", VIEW["gtrid"], "--xid", "1_a_b", "--yes", "--why", "x"])[0] == 2
    code, _, _ = run(["rollback", "--xid", "1_a_b", "--yes", "--why", "x"])
    assert code == 0 and fake.calls[0][:2] == ("rollback --xid", "1_a_b")


def test_list_filters_and_recover_errors(fake: Fake) -> None:
    code, out, _ = run(["list", "--in-doubt"])
    assert code == 0 and VIEW["gtrid"] in out[0] and "n1:000000000002000000000002" not in out[0]
    code, out, _ = run(["list", "--older-than", "1m"])
    assert code == 0 and "n1:000000000002000000000002" not in out[0]
    assert run(["list", "--older-than", "soon"])[0] == 2
    code, out, _ = run(["recover"])
    assert code == 1 and "ERROR: pg: down" in out[0]


def test_forget_confirms(fake: Fake) -> None:
    assert run(["forget", VIEW["gtrid"]], answers=["n"])[0] == 4
    code, _, _ = run(["forget", VIEW["gtrid"], "--yes", "--who", "me"])
    assert code == 0 and fake.calls == [("forget", VIEW["gtrid"], "me")]


def test_online_operations_share_the_nodes_recovery_lock(tmp_path: Path) -> None:
    class T2:
        class node:
            value = "n1"

        log = pg = db = None
        recovery_lock = threading.RLock()

        class recovery:
            guard = 60.0

        class coordinator:
            @staticmethod
            def in_flight() -> frozenset[str]:
                return frozenset()

        def recover_now(self) -> Any:
            return None

        def resolve(self, gtrid: str, action: Any, who: str, why: str, *, heuristic: bool = False) -> Any:
            return None

        def broker_problem(self) -> str | None:
            return None

    t2 = T2()
    ops = node_ops(t2, tmp_path)
    assert ops.serial is t2.recovery_lock and ops.guard_s == 60.0 and ops.mode == "online"
    assert ops._resolve == t2.resolve       # an operator's decision goes through the node (ledger hops)
    assert ops._broker_check == t2.broker_problem   # checked before a commit that re-sends


def test_every_operator_request_is_in_the_operator_log_also_when_it_fails(tmp_path: Path) -> None:
    """Refused (an unknown transaction) or failed (the database broke mid-way): both are written, then raised."""
    import json

    from router.routing.t2.ops import AUDIT_FILE, Refused, TxnOps

    class Pg:
        broken = False

        def recover(self) -> list[Any]:
            if self.broken:
                raise RuntimeError("server closed the connection")
            return []

    pg = Pg()
    ops = TxnOps("n1", tmp_path, None, pg, None, None, mode="offline", guard_s=0.0)  # type: ignore[arg-type]
    with pytest.raises(Refused, match="no transaction n1:x"):
        ops.resolve("n1:x", "rollback", "me", "why")
    pg.broken = True
    with pytest.raises(RuntimeError):
        ops.resolve("n1:x", "heuristic-commit", "me", "why")
    lines = [json.loads(x) for x in (tmp_path / AUDIT_FILE).read_text().splitlines()]
    assert [(e["action"], e["target"], e["who"], e["result"][:8]) for e in lines] == [
        ("rollback", "n1:x", "me", "refused:"), ("heuristic-commit", "n1:x", "me", "failed: ")]


def test_an_offline_read_only_dsn_keeps_the_dsns_own_options(tmp_path: Path) -> None:
    """Review finding: make_conninfo(dsn, options=...) replaced the DSN's own options (e.g. a search_path), so
    list/show could read another schema."""
    from types import SimpleNamespace

    from psycopg.conninfo import conninfo_to_dict

    from router.cli.txn import offline_database

    cfg = SimpleNamespace(postgres=SimpleNamespace(dsn="host=db dbname=n options='-c search_path=nsjms'"))
    with offline_database(cfg, tmp_path, write=False) as dsn:
        assert conninfo_to_dict(dsn)["options"] == "-c search_path=nsjms -c default_transaction_read_only=on"
    with offline_database(cfg, tmp_path, write=True) as dsn:
        assert conninfo_to_dict(dsn)["options"] == "-c search_path=nsjms"
