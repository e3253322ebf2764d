"""``nsjms audit`` and ``nsjms ledger export`` against the quick-start node's own ledger with no DSN given (issue 28):
a real ``nsjms serve --demo`` on the embedded defaults writes ledger rows through its two bridges; the commands find
its database from ``--state-dir`` alone, while it runs (its embedded PostgreSQL) and once it is stopped (started for
the command under the state directory's lock and stopped after, as ``nsjms txn`` does), and never print the DSN's
password. The incremental audit is used (no Spark: the JDBC audit reads the same DSN)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from test_node_lifecycle import EmbeddedNode

from router.node.services import EmbeddedPostgres

pytestmark = pytest.mark.integration

DEMO_EVENTS = 4
DEADLINE_S = 240.0


class DemoNode(EmbeddedNode):
    def command(self, orb_port: int | None = None) -> list[str]:
        return [*super().command(orb_port), "--demo", "--demo-count", str(DEMO_EVENTS), "--demo-rate", "4"]


@pytest.fixture
def demo_node() -> Iterator[DemoNode]:
    base = Path(tempfile.mkdtemp(prefix="nsjms-audit-node-"))
    base.chmod(0o711)  # the postgres OS user must traverse it
    node = DemoNode(base / "state")
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


def delivered(report: dict[str, object], direction: str) -> int:
    days = report["days"]
    assert isinstance(days, list)
    return sum(g["obligations"] for d in days for g in d["groups"]
               if g["direction"] == direction and g["status"] == "delivered")


def test_audit_and_export_find_the_quick_start_nodes_database(demo_node: DemoNode, tmp_path: Path) -> None:
    node, out = demo_node, tmp_path / "audit"
    password = (node.state_dir / "pg" / "password").read_text().strip()
    outputs: list[str] = []

    def cli(*args: str) -> tuple[int, dict[str, object] | None]:
        done = node.run_cli(*args, "--state-dir", str(node.state_dir))
        outputs.append(done.stdout + done.stderr)
        report = out / "incremental.json"
        return done.returncode, json.loads(report.read_text()) if report.exists() else None

    # running node: its embedded PostgreSQL, found from the state directory alone; wait for the demo's deliveries
    deadline, report = time.monotonic() + DEADLINE_S, None
    while time.monotonic() < deadline:
        code, report = cli("audit", "--incremental", "--grace", "3600", "--out", str(out))
        assert code == 0, outputs[-1]
        assert report is not None
        if min(delivered(report, "channel_to_jms"), delivered(report, "jms_to_channel")) >= DEMO_EVENTS:
            break
        time.sleep(1.0)
    assert report is not None, outputs[-1]
    assert delivered(report, "channel_to_jms") == delivered(report, "jms_to_channel") == DEMO_EVENTS, outputs[-1]
    totals = report["totals"]
    assert isinstance(totals, dict) and totals["lost"] == totals["duplicated"] == 0
    # rows of a routing transaction (T2) name the node that wrote them by their gtrid; others count under "-"
    nodes = {(g["direction"], g["node"]) for d in report["days"] for g in d["groups"]}  # type: ignore[attr-defined]
    assert {n for _, n in nodes} <= {"-", node.endpoints()["node_id"]}, nodes
    assert "per node" in outputs[-1]

    node.stop()                                                   # an orderly stop stops the embedded PostgreSQL
    pg = EmbeddedPostgres(node.state_dir, node.pg_port)
    assert pg._running_port() is None
    code, _ = cli("audit", "--incremental", "--if-running", "--out", str(tmp_path / "skipped"))
    assert code == 0 and "nothing done" in outputs[-1] and pg._running_port() is None

    # stopped node: its cluster started for the command, stopped after
    code, report = cli("audit", "--incremental", "--grace", "3600", "--out", str(out))
    assert code == 0, outputs[-1]
    assert report is not None and delivered(report, "channel_to_jms") == DEMO_EVENTS
    assert pg._running_port() is None
    now = datetime.now(UTC)
    export = tmp_path / "export"
    done = node.run_cli("ledger", "export", "--from", (now - timedelta(days=1)).isoformat(), "--to",
                        (now + timedelta(hours=1)).isoformat(), "--out", str(export), "--state-dir",
                        str(node.state_dir))
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, outputs[-1]
    rows = sum(pq.read_table(f).num_rows for f in export.glob("day=*/*.parquet"))
    assert rows >= 4 * DEMO_EVENTS                              # accepted + delivered, both directions
    assert pg._running_port() is None
    assert all(password not in o for o in outputs)
