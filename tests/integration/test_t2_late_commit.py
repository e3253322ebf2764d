"""JMS -> channel T2 branches committed by someone other than their driver reach the consumer without a restart
(issue 31, review finding 5; router/routing/t2/latecommit.py), with a real node, PostgreSQL and ActiveMQ.

The node is killed inside the first T2 (NSJMS_CRASH_AT), so its PostgreSQL branch stays prepared with the T2's
events, queue rows and inbox rows, and the broker redelivers its messages after the restart. At the restart the
first recovery pass is paused before it finishes that branch (NSJMS_PAUSE_AT) and its PostgreSQL session is
terminated there, so the pass fails on it and the node starts routing with the branch still prepared; the bridge's
T2s over the redelivered messages wait on its inbox rows. Then the branch is committed late, behind the channel's
back:

* by a background recovery pass (the T2 was decided: killed after its COMMIT record);
* by an operator's online ``nsjms txn commit --heuristic`` (the T2 was undecided: killed after its prepare).

The inbox then turns the redelivered messages into acks without events, so the T2's events reach the consumer only
if the running node queues the committed rows. Counted at a standard-stub pull consumer drained after the commit:
every message once (before, the T2's events stayed in PostgreSQL until the next start).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import Xid

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    channel_ep,
    inbox_count,
    jms_ep,
    prepared_gids,
    reconnect_client,
    stomp_produce,
    t2_channel,
    unique_name,
)
from conftest import NsjmsServer, free_port
from stdclients import Form, PullConsumerClient, Style, obtain_proxy_supplier, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 90.0
N, BATCH = 40, 20
#: What psycopg's ``tpc_recover()`` sends: the last statement of recovery's own PostgreSQL session (xa.pg.PgManager).
RECOVER_SQL = "SELECT gid, prepared, owner, database FROM pg_prepared_xacts"


@pytest.fixture
def node(tmp_path: Path, fresh_db: str, broker_url: str) -> Iterator[NsjmsServer]:
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
    try:
        yield server
    finally:
        server.stop()


def cli(server: NsjmsServer, *args: str) -> tuple[int, str, str]:
    """``nsjms ARGS`` against the running node (online mode, the test's operator credential)."""
    env = dict(os.environ, NSJMS_POSTGRES_DSN=server.pg_dsn)
    proc = subprocess.run([sys.executable, "-m", "router.cli", *args, "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _ids(events: list[Any]) -> collections.Counter[int]:
    return collections.Counter(int({p.name: p.value.value() for p in ev.filterable_data}["n"]) for ev in events)


def _kill_inside_the_first_t2(node: NsjmsServer, client_orb: Any, broker_url: str, dsn: str, crash_at: str,
                              monkeypatch: pytest.MonkeyPatch) -> tuple[Any, PullConsumerClient, int, list[str]]:
    """A T2 channel (BATCH events per T2), a pull consumer, N messages, a JMS -> channel bridge; the node dies at
    ``crash_at`` of the first T2. Returns (bridge, consumer, bridge id, the prepared GIDs: the first T2's, and
    the second's when it prepared meanwhile)."""
    queue = unique_name("t2in.late")
    monkeypatch.setenv("NSJMS_CRASH_AT", crash_at)
    node.start()
    monkeypatch.delenv("NSJMS_CRASH_AT")
    factory = client_orb.factory(node.ior())
    channel, cid = t2_channel(factory, events=BATCH)
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.SEQUENCE, Style.PULL)
    consumer = PullConsumerClient(proxy, Form.SEQUENCE, 100)
    consumer.connect()
    stomp_produce(broker_url, queue, range(N))
    bridge, bid = bridge_factory(client_orb, node).create_bridge(jms_ep(BA.SOURCE, queue),
                                                                 channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert node.proc is not None
    node.proc.wait(timeout=TIMEOUT_S)
    assert node.proc.returncode == -9, "the crash point killed the node"
    gids = prepared_gids(dsn)
    assert gids, "the first T2's PostgreSQL branch is prepared"
    assert inbox_count(dsn, bid) == 0, "the first T2's rows are in its prepared branch only"
    return bridge, consumer, bid, gids


def _restart_with_the_first_pass_failing_on(node: NsjmsServer, dsn: str, pause_at: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Restart; the first recovery pass pauses at ``pause_at`` (before it finishes the branch), its session is
    terminated there, so that finish fails and the node starts routing with the branch still prepared."""
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    name = pause_at.partition("@")[0]
    reached, go = pauses / f"{name}.1.reached", pauses / f"{name}.1.go"
    terminated: list[int] = []

    def break_the_session() -> None:
        if not wait_until(reached.exists, TIMEOUT_S):
            return
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND pid <> pg_backend_pid() AND query = %s",
                                (RECOVER_SQL,)).fetchall()
        terminated.append(len(rows))
        go.touch()

    helper = threading.Thread(target=break_the_session, daemon=True)
    helper.start()
    monkeypatch.setenv("NSJMS_PAUSE_AT", pause_at)
    monkeypatch.setenv("NSJMS_PAUSE_DIR", str(pauses))
    try:
        node.restart()
    finally:
        monkeypatch.delenv("NSJMS_PAUSE_AT")
        go.touch()
        helper.join(timeout=TIMEOUT_S)
    assert terminated == [1], f"recovery's session was not found at {pause_at}: {terminated}"
    log_text = node.stderr_path.read_text(errors="replace")
    assert "T2 recovery at start" in log_text and "1 problem(s)" in log_text, \
        "the first recovery pass did not fail on the branch: the test did not exercise a late commit"


def _assert_every_message_once(consumer: PullConsumerClient, bridge: Any, dsn: str, bid: int) -> None:
    reconnect_client(bridge, consumer.proxy)
    got = consumer.drain(N, TIMEOUT_S)
    got += consumer.drain(N, 1.0)             # anything more is a duplicate
    counts = _ids(got)
    lost = sorted(set(range(N)) - set(counts))
    dups = {i: c for i, c in counts.items() if c > 1}
    assert not lost and not dups, f"without a second restart: lost {lost} ({len(lost)}), duplicated {dups}"
    assert wait_until(lambda: inbox_count(dsn, bid) == N, TIMEOUT_S), f"{inbox_count(dsn, bid)} inbox rows of {N}"
    assert prepared_gids(dsn) == []


def test_a_decided_branch_recovery_commits_after_the_start_is_queued_without_a_restart(
        node: NsjmsServer, client_orb: Any, broker_url: str, fresh_db: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bridge, consumer, bid, _ = _kill_inside_the_first_t2(node, client_orb, broker_url, fresh_db,
                                                         "t2.after_decision@1", monkeypatch)
    _restart_with_the_first_pass_failing_on(node, fresh_db, "t2.recovery.before_pg_commit@1", tmp_path,
                                            monkeypatch)
    _assert_every_message_once(consumer, bridge, fresh_db, bid)
    log_text = node.stderr_path.read_text(errors="replace")
    assert f"queued {BATCH} event(s) of 1 PostgreSQL branch(es) committed by recovery" in log_text
    pid = node.pid
    assert node.proc is not None and node.proc.poll() is None and node.pid == pid, "the node restarted"
    print(f"a decided T2 committed by background recovery: {N} messages, each once, without a restart")


def test_an_undecided_branch_an_operator_commits_online_is_queued_without_a_restart(
        node: NsjmsServer, client_orb: Any, broker_url: str, fresh_db: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bridge, consumer, bid, gids = _kill_inside_the_first_t2(node, client_orb, broker_url, fresh_db,
                                                            "t2.after_prepare@1", monkeypatch)
    [gid] = gids                               # undecided: the second T2 begins only once the first decided
    _restart_with_the_first_pass_failing_on(node, fresh_db, "t2.recovery.before_pg_rollback@1", tmp_path,
                                            monkeypatch)
    gtrid = Xid.from_string(gid).gtrid
    # recovery presumes it aborted only once it is older than the in-flight guard (60 s by its prepare time)
    code, out, err = cli(node, "txn", "commit", gtrid, "--heuristic", "--yes", "--why", "late-commit test")
    assert code == 0, f"{out}\n{err}"
    assert prepared_gids(fresh_db) == []
    _assert_every_message_once(consumer, bridge, fresh_db, bid)
    print(f"undecided T2 {gtrid} committed online by an operator: {N} messages, each once, without a restart")
