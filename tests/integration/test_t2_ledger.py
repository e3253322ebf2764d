"""The ledger rows of the routing transaction T2, both ways (docs/audit.md "Inside a routing transaction").

Real node, PostgreSQL, ActiveMQ (STOMP for the node and the producer, OpenWire for the Java consumer), CORBA over
IIOP. Channel → JMS through a T2 bridge and JMS → channel through a T2 pull proxy; then:

* every ``channel_to_jms`` obligation has ``accepted`` and one ``delivered`` row; the delivered row carries the
  gtrid of the T2 that sent the message and, as ``jms_message_id``, the message's ``nsjms_dedupe_id`` exactly as the
  broker holds it (``<gtrid>/<index>``, the right message for the right event), and every hop in order: accepted
  <= dispatched <= prepared <= decided <= broker-committed (filled by the node's purge of ended T2s), no
  acknowledged time (the JMS consumer's ack is not the router's to see);
* every ``jms_to_channel`` obligation's rows carry the JMS message id the inbox holds and the gtrid the inbox
  recorded for it; the accepted rows of the events it became carry that gtrid too; its delivered row has every
  hop in order, acknowledged = broker-committed (the broker transaction that commits the ACKs);
* ``nsjms audit`` over that ledger: nothing lost, nothing duplicated, every obligation delivered, exit 0, and
  the per-hop latencies include the decide and broker-commit hops of both directions;
* in a copy of that ledger (its ``nsjms ledger export``) one delivered row is deleted and another duplicated: the
  audit reports exactly that one loss and that one duplicate and exits 7, and its HTML report renders in headless
  Chromium (screenshot ``report.png`` in the test's directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from test_audit_job import _screenshot

from audit.cli import EXIT_VIOLATION
from audit.export import export_days
from idl.generated import CosBridgeAdmin as BA
from xa.xid import parse_gtrid

from bridgekit import (
    AUDIT_TIMEOUT_S,
    JavaTool,
    audit_ledger,
    bridge_factory,
    by_dedupe_id,
    channel_ep,
    dedupe_ids,
    event_numbers,
    inbox_drained,
    jms_ep,
    ledger_count,
    ledger_rows,
    persistent_channel,
    stomp_produce,
    structured_consumer,
    structured_supplier,
    t2_bridge,
    t2_channel,
    unique_name,
)
from conftest import NsjmsServer
from stdclients import make_event, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2700)]  # two Spark audits: minutes each when shared

N = 30
TIMEOUT_S = 60.0
PERSISTENT = 1


def _summary(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT direction, outcome, gtrid IS NOT NULL, count(*) FROM nsjms_ledger "
                            "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3").fetchall()


def _hops_in_order(r: dict[str, Any]) -> None:
    assert None not in (r["dispatched_at"], r["prepared_at"], r["decided_at"], r["broker_committed_at"]), r
    assert r["accepted_at"] <= r["dispatched_at"] <= r["prepared_at"] <= r["decided_at"] <= r["broker_committed_at"], r
    if r["direction"] == "jms_to_channel":
        assert r["acknowledged_at"] == r["broker_committed_at"], r
    else:
        assert r["acknowledged_at"] is None, r


def _hops_missing(dsn: str) -> int:
    return ledger_count(dsn, "gtrid IS NOT NULL AND outcome = 'delivered' AND (decided_at IS NULL OR "
                       "broker_committed_at IS NULL)")


def test_t2_rows_carry_gtrid_dedupe_and_message_ids_and_the_audit_finds_nothing_wrong(
        nsjms_server: NsjmsServer, factory: Any, client_orb: Any, java_tool: JavaTool, broker_url: str,
        fresh_db: str, tmp_path: Path) -> None:
    dsn = fresh_db
    bf = bridge_factory(client_orb, nsjms_server)
    # channel → JMS in T2s of at most 10 events
    out_queue = unique_name("t2ledger.out")
    _out_bridge, out_bid, out_channel = t2_bridge(bf, factory, out_queue, 10, 30)
    supplier = structured_supplier(out_channel)
    for i in range(N):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    got = java_tool.consume("queue", out_queue, N, TIMEOUT_S)
    assert event_numbers(got) == list(range(N))
    dedupe = dedupe_ids(got)                       # the messages' nsjms_dedupe_id at the broker, in event order
    # JMS → channel in T2s of at most 10 messages, on to a CORBA consumer
    in_queue = unique_name("t2ledger.in")
    in_channel, in_cid = t2_channel(factory, events=10)
    consumer = structured_consumer(in_channel)
    stomp_produce(broker_url, in_queue, range(N))
    in_bridge, in_bid = bf.create_bridge(jms_ep(BA.SOURCE, in_queue), channel_ep(BA.SINK, in_cid, BA.PULL))
    in_bridge.start_bridge()
    assert wait_until(lambda: inbox_drained(dsn, in_bid, N, consumer), TIMEOUT_S), f"{consumer.count()} of {N}"
    assert wait_until(lambda: ledger_count(dsn, "outcome = 'delivered'") == 3 * N, TIMEOUT_S), _summary(dsn)
    # the decision and broker-commit hops arrive with the node's next purge of ended T2s (every 5 s)
    assert wait_until(lambda: _hops_missing(dsn) == 0, TIMEOUT_S), _hops_missing(dsn)

    # channel → JMS: accepted, then delivered in the T2 that sent the message
    to_jms = by_dedupe_id(ledger_rows(dsn, "direction = 'channel_to_jms'"))
    assert len(to_jms) == N
    delivered = sorted((o[1] for o in to_jms.values()), key=lambda r: r["event_id"])
    for obl in to_jms.values():
        assert [r["outcome"] for r in obl] == ["accepted", "delivered"], obl
        assert obl[0]["accepted_at"] == obl[1]["accepted_at"] and obl[0]["gtrid"] is None
    assert [r["jms_message_id"] for r in delivered] == dedupe, "each event's row names its own message"
    for r in delivered:
        assert r["gtrid"] == r["jms_message_id"].rsplit("/", 1)[0] and parse_gtrid(r["gtrid"]) is not None
        assert (r["bridge_id"], r["destination"]) == (int(out_bid), f"queue/{out_queue}")
        _hops_in_order(r)
    out_gtrids = {r["gtrid"] for r in delivered}
    assert 3 <= len(out_gtrids) <= N, "batches of at most 10 events per T2"

    # JMS → channel: the inbox's message ids and gtrids
    with psycopg.connect(dsn) as conn:
        inbox: dict[str, str] = dict(conn.execute("SELECT message_id, gtrid FROM nsjms_inbox WHERE bridge_id = %s",
                                  (int(in_bid),)).fetchall())
    assert len(inbox) == N
    from_jms = by_dedupe_id(ledger_rows(dsn, "direction = 'jms_to_channel'"))
    assert len(from_jms) == N
    for dedupe_id, obl in from_jms.items():
        assert [r["outcome"] for r in obl] == ["accepted", "delivered"], obl
        mid = obl[0]["jms_message_id"]
        assert dedupe_id == f"j{in_bid}/{mid}" and mid in inbox
        assert {r["gtrid"] for r in obl} == {inbox[mid]}, "the gtrid of the T2 that claimed it in the inbox"
        assert obl[0]["prepared_at"] == obl[1]["prepared_at"] is not None
        _hops_in_order(obl[1])
    onward = ledger_rows(dsn, "direction = 'channel_to_consumer' AND channel_id = %s AND outcome = 'accepted'",
                         (int(in_cid),))
    assert len(onward) == N
    by_event = {o[0]["event_id"]: o[0]["gtrid"] for o in from_jms.values()}
    assert all(r["gtrid"] == by_event[r["event_id"]] for r in onward), "stored by the same T2"
    nodes = {parse_gtrid(g).node for g in [*out_gtrids, *inbox.values()]}   # type: ignore[union-attr]
    assert len(nodes) == 1, nodes

    # the audit over that ledger
    summary = audit_ledger(dsn, tmp_path / "audit")
    assert summary["lost"] == 0 and summary["duplicated"] == 0, summary
    assert summary["by_status"] == {"delivered": 3 * N}, summary
    latency = summary["latency_ms"]
    for hop in ("dispatch", "prepare", "decide", "broker_commit"):
        assert latency[hop]["channel_to_jms"]["samples"] == N and latency[hop]["jms_to_channel"]["samples"] == N, hop
    assert latency["acknowledge"]["jms_to_channel"]["samples"] == N and "channel_to_jms" not in latency["acknowledge"]
    print(f"T2 ledger: {len(out_gtrids)} channel -> JMS T2s, {len(set(inbox.values()))} JMS -> channel T2s; "
          f"audit {summary['by_status']}")

    # a copy of that ledger with one delivered row deleted and another duplicated: exactly those two found
    gone, twice = delivered[N // 2]["dedupe_id"], next(iter(from_jms))
    copy = _tampered_copy(dsn, tmp_path / "ledger-copy", gone=gone, twice=twice)
    as_of = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")  # anything undelivered = lost
    out = tmp_path / "audit-copy"
    proc = _audit(dsn, out, "--parquet", str(copy), "--as-of", as_of)
    assert proc.returncode == EXIT_VIOLATION, proc.stdout + proc.stderr[-4000:]
    assert "VIOLATION: 1 lost (allowed 0); 1 duplicated (allowed 0)" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["lost_ids"], summary["duplicate_ids"]) == ([gone], [twice]), summary
    assert summary["by_status"] == {"delivered": 3 * N - 2, "lost": 1, "duplicated": 1}, summary
    html = out / "report.html"
    assert html.read_text().count('src="data:image/png;base64,') == 4  # self-contained: the 4 plots embedded
    png = tmp_path / "report.png"
    _screenshot(html, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
    print(f"tampered copy: lost {gone}, duplicated {twice}; screenshot {png}")


def _audit(dsn: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "NSJMS_POSTGRES_DSN": dsn}  # the DSN: off the command line
    return subprocess.run([sys.executable, "-m", "router.cli", "audit", "--out", str(out), "--master", "local[2]",
                           "--shuffle-partitions", "2", *args], check=False, capture_output=True, text=True,
                          timeout=AUDIT_TIMEOUT_S, env=env)


def _tampered_copy(dsn: str, folder: Path, *, gone: str, twice: str) -> Path:
    """The ledger exported to Parquet by day (a copy), then: ``gone``'s delivered row deleted, ``twice``'s
    delivered row written a second time."""
    now = datetime.now(UTC)
    export_days(dsn, now - timedelta(days=2), now + timedelta(days=1), folder, progress=False)
    changed = 0
    for f in sorted(folder.glob("day=*/part-0.parquet")):
        table = pq.read_table(f)
        delivered = pc.equal(table["outcome"], "delivered")
        drop = pc.and_(delivered, pc.equal(table["dedupe_id"], gone))
        again = table.filter(pc.and_(delivered, pc.equal(table["dedupe_id"], twice)))
        kept = table.filter(pc.invert(drop))
        changed += (table.num_rows - kept.num_rows) + again.num_rows
        pq.write_table(pa.concat_tables([kept, again]), f)
    assert changed == 2, "one row deleted, one duplicated"
    return folder




def test_a_pull_without_t2_writes_the_jms_to_channel_rows_too(nsjms_server: NsjmsServer, factory: Any,
                                                              client_orb: Any, broker_url: str,
                                                              fresh_db: str) -> None:
    """EnableTransaction FALSE on a Persistent channel pulling from a bridge of its node (one local unit of work per
    round, router.channel.t2in.round_local): each message's ``accepted`` and ``delivered`` rows with the inbox's
    JMS message id, no gtrid and no T2 hops. (Before, these pulls stored events without any ``jms_to_channel`` row.)"""
    dsn = fresh_db
    channel, cid = persistent_channel(factory)
    consumer = structured_consumer(channel)
    queue = unique_name("t2ledger.local")
    stomp_produce(broker_url, queue, range(N))
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, BA.PULL))
    bridge.start_bridge()
    assert wait_until(lambda: inbox_drained(dsn, bid, N, consumer), TIMEOUT_S), f"{consumer.count()} of {N}"
    assert wait_until(lambda: ledger_count(dsn, "direction = 'jms_to_channel' AND outcome = 'delivered'") == N,
                      TIMEOUT_S), _summary(dsn)
    with psycopg.connect(dsn) as conn:
        inbox = {r[0] for r in conn.execute("SELECT message_id FROM nsjms_inbox WHERE bridge_id = %s",
                                            (int(bid),)).fetchall()}
    from_jms = by_dedupe_id(ledger_rows(dsn, "direction = 'jms_to_channel'"))
    assert len(from_jms) == N
    for obl in from_jms.values():
        assert [r["outcome"] for r in obl] == ["accepted", "delivered"], obl
        assert obl[0]["jms_message_id"] in inbox and {r["gtrid"] for r in obl} == {None}
        assert obl[1]["acknowledged_at"] is not None and obl[1]["prepared_at"] is None
