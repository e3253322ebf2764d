"""The channel's dead-letter store, end to end: a standard-stub CORBA push consumer of a Persistent channel refuses
two events every time (``BAD_PARAM``, ``DATA_CONVERSION``); the channel gives up on each after its bounded attempts
and moves it to the dead-letter store with a readable reason, while the traffic behind keeps flowing. The dead
letters survive a node restart; ``nsjms deadletter list`` / ``show`` report them; once the consumer is fixed,
``retry`` delivers the first exactly once; ``discard`` removes the second; both are in the operator log.

Before the store existed the channel deleted such an event with a log line only: it existed nowhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from omniORB import CORBA

import CosNotification

from router.routing.t2.ops import AUDIT_FILE

from conftest import NsjmsServer
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_pull_supplier,
    connect_push_consumer,
    event_id,
    make_event,
    make_pull_supplier,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    persistent_qos,
    prop,
)

pytestmark = pytest.mark.integration

S = Form.STRUCTURED
DEADLINE_S = 60.0


class RefusingConsumer(StructuredPushConsumer):
    """Raises ``refuse[n]`` for event ``n`` every time it is pushed, while ``refuse`` holds it; counts the calls."""

    def __init__(self, refuse: dict[int, Callable[[], Exception]]) -> None:
        super().__init__()
        self.refuse = refuse
        self.refused: list[int] = []

    def push_structured_event(self, notification: Any) -> None:
        n = event_id(notification)
        make = self.refuse.get(n)
        if make is not None:
            self.refused.append(n)
            raise make()
        super().push_structured_event(notification)


def wait_until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def cli(server: NsjmsServer, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "router.cli", *args, "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, env=dict(os.environ), stdin=subprocess.DEVNULL, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def dead_letters(server: NsjmsServer, *extra: str) -> list[dict[str, Any]]:
    code, out, err = cli(server, "deadletter", "list", "--json", *extra)
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)["dead_letters"]
    return rows


def operator_log(server: NsjmsServer) -> list[dict[str, Any]]:
    path = server.state_dir / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_refused_events_are_kept_listed_retried_once_and_discarded(nsjms_server: NsjmsServer,
                                                                   client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    channel, cid = factory.create_channel(persistent_qos(), [])
    consumer = RefusingConsumer({2: lambda: CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO),
                                 4: lambda: CORBA.DATA_CONVERSION(0, CORBA.COMPLETED_NO)})
    proxy, pid = obtain_proxy_supplier(channel.default_consumer_admin, S, Style.PUSH)
    connect_push_consumer(proxy, S, consumer)
    supplier = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)[0], S)
    supplier.connect()
    persistent = CosNotification.Persistent
    supplier.push_all([make_event(i, reliability=persistent) for i in range(8)])

    # The traffic behind the refused events keeps flowing; each refused one is tried a bounded number of times.
    wait_until(lambda: consumer.ids() == [0, 1, 3, 5, 6, 7], "the events around the refused ones")
    wait_until(lambda: len(dead_letters(nsjms_server)) == 2, "two dead letters in the store")
    rows = {r["event_name"]: r for r in dead_letters(nsjms_server, "--channel", str(cid))}
    assert sorted(rows) == ["nsjms.test/Tick/e2", "nsjms.test/Tick/e4"], rows
    bad_param, conversion = rows["nsjms.test/Tick/e2"], rows["nsjms.test/Tick/e4"]
    # a DATA_CONVERSION the consumer raises itself (minor 0, not CannotMapChar) is an ordinary failed attempt: no
    # narrowing of the text (docs/mapping.md "Text and code sets")
    assert consumer.refused.count(2) == consumer.refused.count(4) == bad_param["attempts"] == 3
    assert "bad parameter" in bad_param["reason"] and bad_param["exception"].startswith("BAD_PARAM")
    assert "code set" in conversion["reason"] and conversion["exception"].startswith("DATA_CONVERSION")
    assert (bad_param["channel_id"], bad_param["side"], bad_param["proxy_id"], bad_param["persistent"]) == \
        (cid, "C", pid, True)
    assert dead_letters(nsjms_server, "--channel", str(cid + 1)) == []

    # A recoverable place: the dead letters outlive the node.
    nsjms_server.stop()
    nsjms_server.restart()
    code, out, err = cli(nsjms_server, "deadletter", "show", str(bad_param["id"]))
    assert code == 0, err
    assert "bad parameter" in out and "payload-000002-" in out and "back into the queue of proxy supplier" in out
    code, out, err = cli(nsjms_server, "deadletter", "list")
    assert code == 0 and "2 dead letter(s)" in out and "nsjms.test/Tick/e4" in out, out + err
    wait_until(lambda: "2 dead letter(s) (nsjms deadletter list)" in cli(nsjms_server, "status")[1],
               "the count in nsjms status")

    # Fixed consumer: the retry delivers it, exactly once; an event pushed after it arrives after it.
    consumer.refuse.clear()
    code, out, err = cli(nsjms_server, "deadletter", "retry", str(bad_param["id"]), "--who", "tester")
    assert code == 0, err
    assert f"dead letter {bad_param['id']}: retried" in out
    try:
        supplier.proxy._non_existent()    # the first call after the restart finds the old connection closed
    except CORBA.COMM_FAILURE:
        pass
    supplier.push_all([make_event(8, reliability=persistent)])
    wait_until(lambda: consumer.ids()[-1:] == [8], "the event pushed after the retry")
    assert consumer.ids() == [0, 1, 3, 5, 6, 7, 2, 8]
    assert [r["event_name"] for r in dead_letters(nsjms_server)] == ["nsjms.test/Tick/e4"]
    code, _, err = cli(nsjms_server, "deadletter", "retry", str(bad_param["id"]))
    assert code == 4 and "no dead letter" in err                  # it left the store with the retry

    # Discard: gone from the store, never delivered, in the operator log with who and why.
    code, out, err = cli(nsjms_server, "deadletter", "discard", str(conversion["id"]))
    assert code == 2 and "--yes" in err                            # no terminal, no --yes: nothing done
    code, out, err = cli(nsjms_server, "deadletter", "discard", str(conversion["id"]), "--yes", "--why", "bad text",
                         "--who", "tester")
    assert code == 0, err
    assert dead_letters(nsjms_server) == []
    assert 4 not in consumer.ids()
    # The ledger agrees: every obligation ended once; the dead-lettered ones say so; the retry is a new obligation.
    def outcomes() -> list[tuple[str, str]]:
        with psycopg.connect(nsjms_server.pg_dsn, autocommit=True) as conn:
            return [(str(d), str(o)) for d, o in conn.execute(
                "SELECT dedupe_id, outcome FROM nsjms_ledger WHERE channel_id = %s ORDER BY entry_id", (cid,))]

    wait_until(lambda: Counter(o for _, o in outcomes()) == {"accepted": 10, "delivered": 8, "dead_letter": 2},
               "one terminal ledger row per obligation")
    ended = dict((d, o) for d, o in outcomes() if o != "accepted")
    assert ended[bad_param["dedupe_id"]] == ended[conversion["dedupe_id"]] == "dead_letter"

    log = operator_log(nsjms_server)
    assert [(e["action"], e["target"]) for e in log] == [("deadletter retry", str(bad_param["id"])),
                                                          ("deadletter retry", str(bad_param["id"])),
                                                          ("deadletter discard", str(conversion["id"]))]
    # the identity is the authenticated principal (the CLI's operator credential), never the --who the caller sends
    assert log[0]["who"] == log[2]["who"] == "operator" and log[2]["why"] == "bad text"
    assert log[0]["result"]["retried"] is True and log[2]["result"]["discarded"] is True
    assert str(log[1]["result"]).startswith("refused: no dead letter")


def test_a_pulled_event_the_channel_refuses_is_kept_and_its_retry_checked_again(nsjms_server: NsjmsServer,
                                                                                client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    channel, cid = factory.create_channel(persistent_qos(), [])
    consumer = StructuredPushConsumer()
    connect_push_consumer(obtain_proxy_supplier(channel.default_consumer_admin, S, Style.PUSH)[0], S, consumer)
    bad = make_event(1, extra_header=[prop("Priority", CORBA.Any(CORBA.TC_string, "high"))])   # BAD_QOS
    supplier = make_pull_supplier(S, [make_event(0), bad, make_event(2)])
    proxy, pid = obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PULL)
    connect_pull_supplier(proxy, S, supplier)

    wait_until(lambda: consumer.ids() == [0, 2], "the pulled events around the refused one")
    wait_until(lambda: len(dead_letters(nsjms_server, "--channel", str(cid))) == 1, "the refused pulled event kept")
    [row] = dead_letters(nsjms_server, "--channel", str(cid))      # before: a log line only
    assert (row["side"], row["proxy_id"], row["event_name"]) == ("S", pid, "nsjms.test/Tick/e1")
    assert "QoS headers are unusable" in row["reason"] and row["exception"].startswith("BAD_QOS")
    code, _, err = cli(nsjms_server, "deadletter", "retry", str(row["id"]))
    assert code == 4 and "refuses it again (BAD_QOS" in err, err  # the channel's checks apply again; kept
    assert [r["id"] for r in dead_letters(nsjms_server)] == [row["id"]]
    code, _, err = cli(nsjms_server, "deadletter", "discard", str(row["id"]), "--yes")
    assert code == 0, err
    assert dead_letters(nsjms_server) == [] and consumer.ids() == [0, 2]


def test_deadletter_with_the_node_stopped_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "router.cli", "deadletter", "list", "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 3 and "no running node" in proc.stderr, proc.stderr
