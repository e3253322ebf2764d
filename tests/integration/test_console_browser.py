"""The operator web console in a real browser (Debian's /usr/bin/chromium driven by Playwright), on a running node.

The node (``nsjms serve`` with ``[console] enabled``) has a bridge with traffic and a REAL in-doubt routing
transaction: a channel -> JMS T2 bridge whose node was SIGKILLed at the crash point ``t2.after_decision`` (COMMIT
logged, nothing committed), restarted with the broker down. From the console the operator's rollback is refused
with the CLI's reason, the commit (confirmed, with a reason) is refused while the broker is down, as the CLI refuses
it; with the broker back the recovery finishes it. A transaction with no decision logged is committed only
heuristically (the CLI's refusal without it), then forgotten. A channel and a bridge with routing transactions are
created, T2 turned off and a bad setting refused (the CLI's words), bridges started as a selection, both destroyed
again; three dead letters retried (one, then two as a selection) each reach their consumer once; two dead letters
of a bridge on the broker (``nsjms.DLQ``) shown beside them, one retried back to its source (an independent stomp.py
consumer gets it once), the other refused to a reader and discarded as a selection; the ledger audit
page shows what ``nsjms audit --incremental`` stored. Every action is in the operator log with the principal and the
reason. A reader has no buttons and is refused on POST; a POST without the CSRF token is refused; an unauthenticated
request is redirected to the login page. Each page is screenshotted into docs/console/ (see docs/console.md).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import Xid

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from router.cli.txn import orphan_summary
from router.node.services import EmbeddedActiveMQ
from xa.xid import FORMAT_ID, NodeId, branch_xid, new_gtrid

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    leftover,
    managed_bridge,
    persistent_channel,
    prepare_foreign,
    prepared_gids,
    reconnect_client,
    structured_supplier,
    unique_name,
)
from conftest import ClientOrb, NsjmsServer, free_port, own_broker
from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    event_id,
    make_event,
    obtain_proxy_supplier,
    wait_until,
)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
PERSISTENT = CosNotification.Persistent


@pytest.fixture
def amq(tmp_path: Path) -> Iterator[EmbeddedActiveMQ]:
    """A broker of the test's own: it is stopped to keep the routing transaction in doubt."""
    with own_broker(tmp_path / "amq") as broker:
        yield broker


@pytest.fixture
def node(tmp_path: Path, fresh_db: str, amq: EmbeddedActiveMQ,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[NsjmsServer]:
    monkeypatch.setenv("NSJMS_CONSOLE_ENABLED", "true")
    monkeypatch.setenv("NSJMS_CONSOLE_PORT", str(free_port()))
    monkeypatch.setenv("NSJMS_LIMITS_MAX_CHANNELS", "3")   # the test's three channels: a fourth meets the quota
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=amq.url, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def console_url(server: NsjmsServer) -> str:
    return f"http://127.0.0.1:{os.environ['NSJMS_CONSOLE_PORT']}"


def secret(server: NsjmsServer, name: str) -> str:
    return (server.state_dir / "credentials" / f"{name}.token").read_text().strip().partition(":")[2]


def _console_listens(base: str) -> bool:
    host, _, port = base.rpartition("//")[2].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


def sign_in(browser: Any, base: str, server: NsjmsServer, name: str) -> Any:
    # the node is ready (endpoints.json) a moment before `nsjms serve` starts its console: wait for it to listen
    # (CI: ERR_CONNECTION_REFUSED once on a loaded machine)
    assert wait_until(lambda: _console_listens(base), 60, 0.2), f"the console does not listen at {base}"
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    page = ctx.new_page()
    page.goto(base + "/login")
    page.fill("#name", name)
    page.fill("#secret", secret(server, name))
    page.click("#signin")
    page.wait_for_load_state()
    assert page.url == base + "/", (page.url, page.content()[:2000])
    assert page.inner_text("#whoami") == f"{name} ({name})"
    return page


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def cli(server: NsjmsServer, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, NSJMS_POSTGRES_DSN=server.pg_dsn)
    proc = subprocess.run([sys.executable, "-m", "router.cli", *args, "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def cli_json(server: NsjmsServer, *args: str) -> Any:
    code, out, err = cli(server, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def make_in_doubt(server: NsjmsServer, amq: EmbeddedActiveMQ, client_orb: ClientOrb,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, str]:
    """A channel -> queue T2 bridge whose node dies at ``t2.after_decision`` (COMMIT durable, nothing committed);
    restarted with the broker down, the transaction stays in doubt: recovery commits the PostgreSQL branch and cannot
    re-send the outbox. Returns the channel factory, the bridge factory and the queue."""
    factory = client_orb.factory(server.ior())
    channel, cid = persistent_channel(factory)
    bf = bridge_factory(client_orb, server)
    queue = unique_name("console.t2")
    bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    managed = managed_bridge(bridge)
    managed.enable_transaction(5, 30)
    bridge.start_bridge()
    supplier = structured_supplier(channel)
    bridge.stop_bridge()
    for i in range(5):                                  # waiting in the stopped bridge's proxy queue
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    server.stop()
    monkeypatch.setenv("NSJMS_CRASH_AT", "t2.after_decision")
    server.start()
    reconnect_client(managed)
    try:
        bridge.start_bridge()                           # its first T2 logs COMMIT, then the node dies
    except CORBA.Exception:
        pass
    assert server.proc is not None and server.proc.wait(60) == -signal.SIGKILL
    monkeypatch.delenv("NSJMS_CRASH_AT")
    assert len(prepared_gids(server.pg_dsn)) == 1
    amq.stop()
    server.start()
    reconnect_client(managed, bf, factory)
    return factory, bf, queue


class RefusingConsumer(StructuredPushConsumer):
    """Refuses event ``n`` (BAD_PARAM) while ``refuse`` holds it: the channel dead-letters it after its retries."""

    def __init__(self, refuse: set[int]) -> None:
        super().__init__()
        self.refuse = refuse

    def push_structured_event(self, notification: Any) -> None:
        if event_id(notification) in self.refuse:
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        super().push_structured_event(notification)


def event_id_of(dead_letter: dict[str, Any]) -> int:
    """The event number ``make_event`` gave a dead-lettered event (its name ends in ``e<N>``)."""
    return int(dead_letter["event_name"].rsplit("/", 1)[1].lstrip("e"))


def operator_log(server: NsjmsServer) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (server.state_dir / "txn-operator.log").read_text().splitlines()]


def _dead_letter_on_broker(broker_url: str, source: str, bridge: int, body: str, event: Any = None) -> str:
    """Put on ``nsjms.DLQ`` what a JMS -> channel bridge writes for a message it cannot map (docs/bridge.md): the
    original body, ``nsjms_dlq_reason``/``_bridge``/``_origin``/``_message_id``/``_destination``; or, with ``event``,
    what a channel -> JMS bridge writes for an event (its CDR encoding, origin ``event``); its message id."""
    import stomp

    import omniORB

    headers = {"nsjms_dlq_origin": "message", "nsjms_dlq_reason": "unmappable JMS message: console test",
               "nsjms_dlq_message_id": f"ID:original-{body}", "nsjms_dlq_destination": f"/queue/{source}"}
    data = body.encode()
    if event is not None:
        data = bytes(omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, event))
        headers = {"nsjms_dlq_origin": "event", "nsjms_dlq_reason": "broker refused the message: console test"}
    host, port = broker_url.removeprefix("stomp://").split(":")
    conn = stomp.Connection12([(host, int(port))], auto_content_length=False)
    conn.connect(wait=True)
    try:
        conn.send("/queue/nsjms.DLQ", data, headers={
            "persistent": "true", "content-length": str(len(data)), "nsjms_dlq_bridge": str(bridge), **headers,
            "receipt": "sent"})
    finally:
        conn.disconnect()
    from router.deadletter.broker import BrokerDeadLetterOps  # the id is found by browsing, as the console does

    ops = BrokerDeadLetterOps("test", Path("/nonexistent"), lambda: _browser(broker_url))
    found: list[str] = []
    assert wait_until(lambda: bool(found.extend(d["id"] for d in ops.listing("nsjms.DLQ")["dead_letters"]
                                                if d["origin"] == headers["nsjms_dlq_origin"] and d["bridge"] == bridge
                                                and (event is not None or d["preview"] == body)) or found), 30, 0.5)
    return found[0]


def _browser(broker_url: str) -> Any:
    from router.jms.stomp.browse import StompBrowser

    return StompBrowser(broker_url)


def _drain(broker_url: str, queue: str, header: str = "") -> list[Any]:
    """Consume (auto-ack) what is on ``queue`` with an independent stomp.py client; 2 s without a message ends it.
    The bodies, or with ``header`` that header of each (None where absent)."""
    import queue as queues

    import stomp

    got: queues.Queue[Any] = queues.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            got.put(frame.headers.get(header) if header else frame.body)

    host, port = broker_url.removeprefix("stomp://").split(":")
    conn = stomp.Connection12([(host, int(port))], auto_decode=False)
    conn.set_listener("drain", Listener())
    conn.connect(wait=True)
    conn.subscribe(f"/queue/{queue}", id="drain", ack="auto")
    bodies = []
    try:
        while True:
            bodies.append(got.get(timeout=2.0))
    except queues.Empty:
        pass
    conn.disconnect()
    return bodies


def test_console_in_a_real_browser(node: NsjmsServer, amq: EmbeddedActiveMQ, client_orb: ClientOrb, browser: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    base = console_url(node)
    factory, bf, t2_queue = make_in_doubt(node, amq, client_orb, monkeypatch)
    [view] = cli_json(node, "txn", "list")["transactions"]
    gtrid = view["gtrid"]
    assert (view["status"], view["action"]) == ("commit-logged", "resend")

    printed = (node.state_dir / "server.stdout.log").read_text()
    assert f"nsjms: console at {base}/  (sign in as operator or reader" in printed, printed

    # unauthenticated: redirected to the login page
    anon = browser.new_context()
    page = anon.new_page()
    page.goto(base + "/bridges")
    assert page.url.startswith(base + "/login?next=")
    shot(page, "login")
    anon.close()

    page = sign_in(browser, base, node, "operator")
    # the in-doubt T2: listed with the safe action and its reason
    page.goto(base + "/transactions?in_doubt=1")
    table = page.inner_text("#transactions")
    assert gtrid in table and view["action"] in table and view["reason"] in table
    shot(page, "transactions")
    # rollback against the logged COMMIT: refused exactly as the CLI refuses it, and recorded
    page.click(f"text={gtrid}")
    page.click("#ask-rollback")
    page.fill("#confirm_gtrid", gtrid)
    page.fill("#why", "console test: try the wrong way")
    page.click("#do-rollback")
    refusal = page.inner_text("#error")
    assert "refused: " in refusal and "the decision COMMIT is logged" in refusal
    assert operator_log(node)[-1]["action"] == "rollback" and operator_log(node)[-1]["who"] == "operator"
    # commit with a reason, behind a confirmation naming the transaction: with the broker down it is refused before
    # anything is touched, exactly as `nsjms txn commit` refuses it, and recorded
    page.goto(f"{base}/transactions/{gtrid}")
    page.click("#ask-commit")
    assert gtrid in page.inner_text("#confirm-form")
    assert page.locator("#heuristic").count() == 0, "COMMIT is logged: no heuristic commit is offered"
    page.fill("#confirm_gtrid", gtrid)
    page.fill("#why", "console test: finish the logged commit")
    shot(page, "transaction-confirm")
    page.click("#do-commit")
    refusal = page.inner_text("#error")
    assert "nothing done" in refusal and "broker cannot be reached" in refusal, refusal
    shot(page, "transaction-result")
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["target"], entry["why"]) == (
        "operator", "commit", gtrid, "console test: finish the logged commit")
    assert entry["result"].startswith("refused: ") and "nothing done" in entry["result"]
    code, _, err = cli(node, "txn", "commit", gtrid, "--yes", "--why", "the CLI, for comparison")
    assert code == 4 and refusal.removeprefix("refused: ").split(" (")[0] in err, err
    # the broker back: the commit is finished (the outbox re-sent with its dedupe ids), nothing left in doubt
    amq.start()
    assert wait_until(lambda: cli_json(node, "txn", "list")["transactions"] == [], 90, 1.0)
    assert prepared_gids(node.pg_dsn) == []
    assert leftover(amq.url, t2_queue) == 5, "the committed transaction's five events, each once"

    # a transaction with NO decision logged (a prepared branch of this node younger than the in-flight guard): the
    # commit is refused with the CLI's words unless "commit heuristically" is ticked (`txn commit --heuristic`); then
    # it is committed and recorded as a heuristic outcome, listed until it is forgotten
    undecided = new_gtrid(NodeId(gtrid.split(":", 1)[0]))
    prepare_foreign(node.pg_dsn, branch_xid(undecided, "pg"))
    page.goto(f"{base}/transactions/{undecided}?confirm=commit")
    assert "WARNING: no COMMIT is logged" in page.inner_text("#heuristic-warning")
    page.fill("#confirm_gtrid", undecided)
    page.fill("#why", "console test: keep it")
    page.click("#do-commit")
    refusal = page.inner_text("#error")
    assert "no COMMIT is logged" in refusal and "Add --heuristic" in refusal, refusal
    page.goto(f"{base}/transactions/{undecided}?confirm=commit")
    page.check("#heuristic")
    page.fill("#confirm_gtrid", undecided)
    page.fill("#why", "console test: keep it")
    shot(page, "transaction-heuristic")
    page.click("#do-commit")
    assert "Done." in page.inner_text("#result"), page.inner_text("main")
    assert prepared_gids(node.pg_dsn) == []
    [after] = cli_json(node, "txn", "list")["transactions"]
    assert (after["gtrid"], after["status"], after["action"]) == (undecided, "heuristic-commit", "forget")
    assert [(e["who"], e["action"], e["target"]) for e in operator_log(node)[-2:]] == [
        ("operator", "commit", undecided), ("operator", "heuristic-commit", undecided)]
    assert operator_log(node)[-2]["result"].startswith("refused: ")
    page.goto(f"{base}/transactions/{undecided}?confirm=forget")
    page.fill("#confirm_gtrid", undecided)
    page.fill("#why", "console test: checked the data")
    page.click("#do-forget")
    assert "Done." in page.inner_text("#result")
    assert cli_json(node, "txn", "list")["transactions"] == []

    # an orphaned prepared branch (the nsjms format id, a gtrid that names no transaction): listed, and decided from
    # the console as `nsjms txn rollback --xid GID` decides it (the CLI's summary, the GID typed back, a reason)
    orphan = prepare_foreign(node.pg_dsn, Xid.from_parts(FORMAT_ID, "hand-made", "outbox"))
    page.goto(base + "/transactions")
    assert orphan in page.content(), page.inner_text("main")
    page.click(f"#orphans a[href='/orphans/{orphan}']")
    page.click("#ask-rollback")
    assert orphan_summary(orphan) in page.inner_text("#orphan-warning")
    page.fill("#confirm_gid", orphan)
    page.fill("#why", "console test: checked, it holds nothing")
    shot(page, "orphan-confirm")
    page.click("#do-rollback")
    assert "Done." in page.inner_text("#result"), page.inner_text("main")
    assert prepared_gids(node.pg_dsn) == []
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["target"], entry["why"]) == (
        "operator", "rollback --xid", orphan, "console test: checked, it holds nothing")
    [after] = cli_json(node, "txn", "list")["transactions"]
    assert (after["gtrid"], after["status"], after["action"]) == ("hand-made", "heuristic-rollback", "forget")
    page.goto(f"{base}/transactions/hand-made?confirm=forget")
    page.fill("#confirm_gtrid", "hand-made")
    page.fill("#why", "console test: checked the data")
    page.click("#do-forget")
    assert "Done." in page.inner_text("#result")
    assert cli_json(node, "txn", "list")["transactions"] == []

    # a bridge with traffic: channel -> queue, 40 events forwarded
    channel, cid = persistent_channel(factory)
    traffic = unique_name("console.traffic")
    _, busy = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, traffic))
    bf.get_bridge_with_id(busy).start_bridge()
    supplier = structured_supplier(channel)

    def forwarded(n: int) -> bool:
        return any(b["id"] == busy and b["forwarded"] == n
                   for b in cli_json(node, "status")["snapshot"].get("bridges", []))

    for wave in (range(20), range(20, 40)):           # two waves: the chart shows the second one's rate
        for i in wave:
            supplier.push_one(make_event(i, reliability=PERSISTENT))
        assert wait_until(lambda n=wave.stop: forwarded(n), 90, 1.0)

    # overview: reachability, the chart drawn by uPlot from the node's samples
    page.goto(base + "/")
    def broker_card() -> str:
        page.reload()
        return str(page.inner_text("#svc-broker"))

    assert wait_until(lambda: broker_card().split()[1] == "reachable", 30, 1.0)
    assert page.inner_text("#svc-postgres").split()[1] == "reachable"
    assert "0 in doubt" in page.inner_text("#in-doubt")
    page.wait_for_selector("#rates canvas", timeout=30_000)
    shot(page, "overview")

    page.goto(base + "/channels")
    assert page.locator("#channels a", has_text=f"channel {cid}").count() == 1
    shot(page, "channels")
    page.click(f"#channels a:text-is('channel {cid}')")
    assert page.url == f"{base}/channels/{cid}"
    assert "EventReliability" in page.content()
    shot(page, "channel")

    page.goto(base + "/bridges")
    assert page.locator("#bridges a", has_text=f"bridge {busy}").count() == 1
    shot(page, "bridges")
    page.goto(f"{base}/bridges/{busy}")
    assert page.inner_text("#forwarded") == "40"
    assert page.locator("#bridge-stop").count() == 1
    page.wait_for_selector("#rates canvas", timeout=30_000)        # the bridge's own chart (its forwarded events/s)
    assert "bridge " + str(busy) in page.inner_text("#rates") and "dead-lettered" in page.inner_text("#rates")
    shot(page, "bridge")
    rows = page.request.get(base + "/bridges?format=json").json()["rows"]
    assert {r["id"] for r in rows} == {r["id"] for r in cli_json(node, "bridge", "list")}

    # a channel created from the console: a QoS the channel refuses is refused with the CLI's words, before anything
    # is sent; a right one creates it on the node
    page.goto(base + "/channels")
    page.fill("#channel-qos", "EventReliability=Persistent")
    page.fill("#channel-why", "console test: a feed")
    page.click("#channel-create")
    refusal = page.inner_text("#error")
    code, _, err = cli(node, "channel", "create", "--qos", "EventReliability=Persistent")
    assert code == 2 and refusal.startswith("refused: --qos EventReliability") and refusal in err, (refusal, err)
    page.goto(base + "/channels")
    page.fill("#channel-qos", "EventReliability=Persistent\nConnectionReliability=Persistent")
    page.fill("#channel-why", "console test: a feed")
    page.click("#channel-create")
    page.wait_for_load_state()
    new_cid = int(page.url.rsplit("/", 1)[1])
    assert new_cid in {c["id"] for c in cli_json(node, "channel", "list")}
    assert "Persistent" in page.inner_text("main")
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["why"], entry["result"]) == (
        "operator", "console channel create", "console test: a feed", {"id": new_cid})
    # a fourth channel meets the node's quota ([limits] max_channels = 3): the node's IMP_LIMIT is a refusal in the
    # words `nsjms channel create` prints for it (409, recorded), not a server error
    page.goto(base + "/channels")
    page.fill("#channel-why", "console test: one too many")
    page.click("#channel-create")
    refusal = page.inner_text("#error")
    code, _, err = cli(node, "channel", "create")
    assert code == 4 and "CORBA.IMP_LIMIT, nothing was done" in refusal and refusal in err, (refusal, err)
    assert page.request.post(f"{base}/channels/create?format=json", form={
        "why": "x", "csrf": page.locator("input[name=csrf]").first.get_attribute("value")}).status == 409
    shot(page, "channel-quota")
    assert operator_log(node)[-1]["result"] == refusal
    assert len(cli_json(node, "channel", "list")) == 3

    # a bridge created from it with routing transactions (T2), not started; T2 turned off and refused a bad setting
    page.goto(base + "/bridges")
    page.fill("#bridge-source", f"channel:{new_cid}")
    page.fill("#bridge-sink", "queue:" + unique_name("console.created"))
    page.fill("#bridge-transaction", "5:30")
    page.check("#bridge-no-start")
    page.fill("#bridge-create-why", "console test: a new route")
    page.click("#bridge-create")
    page.wait_for_load_state()
    new_bid = int(page.url.rsplit("/", 1)[1])
    row = next(b for b in cli_json(node, "bridge", "list") if b["id"] == new_bid)
    assert row["source"].startswith(f"channel:{new_cid}") and row["started"] is False
    assert operator_log(node)[-1]["result"] == {"id": new_bid, "started": False}

    def t2_button(which: str) -> bool:
        page.reload()                                   # the bridge's T2 state is in the node's 2 s snapshot
        return bool(page.locator(f"#bridge-t2-{which}").count() == 1)

    assert wait_until(lambda: t2_button("off"), 30, 1.0)
    assert "on: 5 event(s) a transaction, timeout 30 s" in page.inner_text("#bridge-t2-form")
    shot(page, "bridge-t2")
    page.fill("#bridge-t2-form input[name=why]", "console test: T2 off")
    page.click("#bridge-t2-off")
    page.wait_for_load_state()
    assert operator_log(node)[-1]["result"] == {"id": new_bid, "transaction": None}
    assert wait_until(lambda: t2_button("on"), 30, 1.0)
    page.fill("#bridge-t2-setting", "zero")
    page.fill("#bridge-t2-form input[name=why]", "console test: a typo")
    page.click("#bridge-t2-on")
    refusal = page.inner_text("#error")
    code, _, err = cli(node, "bridge", "transaction", str(new_bid), "zero")
    assert code == 2 and refusal.removeprefix("refused: ") in err, (refusal, err)
    assert operator_log(node)[-1]["result"].startswith("refused: 'zero': expected EVENTS[:TIMEOUT]")
    # routing transactions the node's bridge refuses (a JMS source pushing into the channel): refused with the CLI's
    # words and the new bridge destroyed again, as `nsjms bridge create --transaction` does (exit 4)
    before = {b["id"] for b in cli_json(node, "bridge", "list")}
    page.goto(base + "/bridges")
    page.fill("#bridge-source", "queue:" + unique_name("console.in"))
    page.fill("#bridge-sink", f"channel:{new_cid}")
    page.fill("#bridge-transaction", "5")
    page.fill("#bridge-create-why", "console test: T2 the wrong way")
    page.click("#bridge-create")
    refusal = page.inner_text("#error")
    code, printed, err = cli(node, "bridge", "create", "--from", "queue:" + unique_name("console.in"),
                             "--to", f"channel:{new_cid}", "--transaction", "5")
    assert code == 4 and "(UnsupportedTransaction)" in refusal, (refusal, printed, err)
    assert [re.sub(r"\d+", "N", x) for x in refusal.removeprefix("refused: ").split("; ")] == [
        re.sub(r"\d+", "N", x.removeprefix("nsjms bridge: ")) for x in printed.splitlines()]
    assert {b["id"] for b in cli_json(node, "bridge", "list")} == before

    # a dead letter: the channel's consumer refuses event 2; retried from the console once it is fixed, it arrives
    refusing = RefusingConsumer({2, 3, 4})
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    connect_push_consumer(proxy, Form.STRUCTURED, refusing)
    for i in range(100, 104):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    for i in (2, 3, 4):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    assert wait_until(lambda: len(cli_json(node, "deadletter", "list")["dead_letters"]) == 3, 90, 1.0)
    dls = sorted(cli_json(node, "deadletter", "list")["dead_letters"], key=lambda d: d["id"])
    dl = dls[0]
    # two dead letters on the broker too (what a bridge writes to nsjms.DLQ: the original body, its reason, bridge
    # and source), shown beside the channel's
    source = unique_name("console.bdl")
    broker_dls = [_dead_letter_on_broker(amq.url, source, busy, f"body {n}") for n in (1, 2)]
    page.goto(base + "/deadletters")
    assert f"dead letter {dl['id']}" in page.inner_text("#deadletters") and "bad parameter" in page.content()
    assert "unmappable JMS message: console test" in page.inner_text("main")
    shot(page, "deadletters")
    page.click(f"#deadletters a:text-is('dead letter {dl['id']}')")
    assert "back into the queue" in page.inner_text("#dl-retry-target")
    shot(page, "deadletter")
    refusing.refuse.clear()
    page.fill("form:has(#dl-retry) input[name=why]", "console test: consumer fixed")
    page.click("#dl-retry")
    assert "Done." in page.inner_text("#result")
    first = event_id_of(dl)
    assert wait_until(lambda: first in refusing.ids(), 60, 0.5), "the retried dead letter reached its consumer"
    assert refusing.ids().count(first) == 1 and len(cli_json(node, "deadletter", "list")["dead_letters"]) == 2
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["target"]) == ("operator", "deadletter retry", str(dl["id"]))
    assert operator_log(node)[-2]["why"] == "console test: consumer fixed"
    # the other two as a selection: each retried through the same operation, each recorded
    page.goto(base + "/deadletters")
    for other in dls[1:]:
        page.check(f"#select-dl-{other['id']}")
    page.fill("#deadletters-why", "console test: the rest")
    page.click("#deadletters-retry")
    assert "Done." in page.inner_text("#result")
    rest = [event_id_of(d) for d in dls[1:]]
    assert wait_until(lambda: all(n in refusing.ids() for n in rest), 60, 0.5)
    assert sorted(refusing.ids().count(n) for n in (2, 3, 4)) == [1, 1, 1], "each retried event arrived once"
    assert cli_json(node, "deadletter", "list")["dead_letters"] == []
    retried = [e for e in operator_log(node) if e["action"] == "deadletter retry"]
    assert {e["target"] for e in retried} == {str(d["id"]) for d in dls} and {e["who"] for e in retried} == {
        "operator"}

    # the broker's dead letters: one retried from its page goes back to its source, once (an independent stomp.py
    # consumer counts it); the other is kept for the reader below
    page.goto(f"{base}/deadletters/broker/nsjms.DLQ")
    page.click(f"#broker-deadletters a code:text-is('{broker_dls[0]}')")
    assert f"back to /queue/{source}" in page.inner_text("#bdl-retry-target")
    assert "unmappable JMS message: console test" in page.inner_text("#bdl-reason")
    shot(page, "brokerdeadletter")
    page.fill("form:has(#bdl-retry) input[name=why]", "console test: mapping fixed")
    page.click("#bdl-retry")
    assert "Done." in page.inner_text("#result")
    assert _drain(amq.url, source) == [b"body 1"], "the retried dead letter reached its source once"
    listed = page.request.get(f"{base}/deadletters/broker/nsjms.DLQ?format=json").json()["dead_letters"]
    assert [d["id"] for d in listed] == [broker_dls[1]]
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["target"], entry["why"]) == (
        "operator", "broker deadletter retry", f"nsjms.DLQ {broker_dls[0]}", "console test: mapping fixed")

    # a POST without the CSRF token is refused (and the bridge keeps running)
    resp = page.request.post(f"{base}/bridges/{busy}/stop", form={"why": "no token"})
    assert resp.status == 403
    assert next(b for b in cli_json(node, "bridge", "list") if b["id"] == busy)["started"] is True

    # a reader sees the pages, has no buttons, and is refused on POST even with a valid CSRF token
    reader = sign_in(browser, base, node, "reader")
    reader.goto(f"{base}/bridges/{busy}")
    assert reader.locator("#bridge-stop").count() == 0 and reader.locator("#bridge-destroy").count() == 0
    token = reader.locator("input[name=csrf]").first.get_attribute("value")
    resp = reader.request.post(f"{base}/bridges/{busy}/stop", form={"why": "reader", "csrf": token})
    assert resp.status == 403
    assert next(b for b in cli_json(node, "bridge", "list") if b["id"] == busy)["started"] is True
    assert operator_log(node)[-1]["who"] == "reader"
    assert operator_log(node)[-1]["result"] == "refused: needs the operator role"
    reader.goto(base + "/bridges")
    assert reader.locator("#bridge-create").count() == 0 and reader.locator(f"#select-bridge-{busy}").count() == 0
    for url, form in ((f"{base}/channels/create", {"qos": "", "why": "reader"}),
                      (f"{base}/bridges/selected", {"ids": str(busy), "action": "stop", "why": "reader"}),
                      (f"{base}/bridges/{busy}/transaction", {"setting": "5", "why": "reader"})):
        assert reader.request.post(url, form={**form, "csrf": token}).status == 403, url
        assert page.request.post(url, form=form).status == 403, url          # the operator without the token
    assert next(b for b in cli_json(node, "bridge", "list") if b["id"] == busy)["started"] is True
    # ... nor on a broker dead letter: no retry or discard button, the POSTs refused, the message kept
    reader.goto(f"{base}/deadletters/broker/nsjms.DLQ/message?id={broker_dls[1]}")
    assert "unmappable JMS message" in reader.inner_text("#bdl-reason")
    assert reader.locator("#bdl-retry").count() == 0 and reader.locator("#bdl-discard").count() == 0
    for url, form in ((f"{base}/deadletters/broker/nsjms.DLQ/retry", {"id": broker_dls[1], "why": "reader"}),
                      (f"{base}/deadletters/broker/nsjms.DLQ/selected",
                       {"ids": broker_dls[1], "action": "discard", "why": "reader"})):
        assert reader.request.post(url, form={**form, "csrf": token}).status == 403, url
        assert page.request.post(url, form=form).status == 403, url          # the operator without the token
    assert [d["id"] for d in page.request.get(f"{base}/deadletters/broker/nsjms.DLQ?format=json").json()[
        "dead_letters"]] == [broker_dls[1]]
    # the operator discards it as a selection: consumed, sent nowhere, recorded
    page.goto(f"{base}/deadletters/broker/nsjms.DLQ")
    page.check(f"input[form=bdl-selected][value='{broker_dls[1]}']")
    page.fill("#bdl-why", "console test: not needed")
    page.click("#bdl-discard")
    assert "Done." in page.inner_text("#result")
    assert page.request.get(f"{base}/deadletters/broker/nsjms.DLQ?format=json").json()["dead_letters"] == []
    assert _drain(amq.url, source) == []
    assert operator_log(node)[-1]["action"] == "broker deadletter discard"
    # an event the busy bridge dead-lettered (its CDR encoding), retried from the console: mapped again and sent to
    # the bridge's queue, which the console asks of its node
    _drain(amq.url, traffic)
    event_dl = _dead_letter_on_broker(amq.url, "", busy, "", event=make_event(555))
    page.goto(f"{base}/deadletters/broker/nsjms.DLQ/message?id={event_dl}")
    assert f"bridge {busy}'s JMS destination" in page.inner_text("#bdl-retry-target")
    page.fill("form:has(#bdl-retry) input[name=why]", "console test: authorised now")
    page.click("#bdl-retry")
    assert "Done." in page.inner_text("#result"), page.inner_text("main")
    assert _drain(amq.url, traffic, "$fd_n") == ["555"], "the retried event reached the bridge's queue once"

    # the operator stops the bridge from the console: done through the node, recorded
    page.goto(f"{base}/bridges/{busy}")
    page.fill("form:has(#bridge-stop) input[name=why]", "console test: maintenance")
    page.click("#bridge-stop")
    page.wait_for_load_state()
    assert page.url == f"{base}/bridges/{busy}"
    assert next(b for b in cli_json(node, "bridge", "list") if b["id"] == busy)["started"] is False
    entry = operator_log(node)[-1]
    assert (entry["who"], entry["action"], entry["why"]) == ("operator", "console bridge stop",
                                                             "console test: maintenance")

    # a selection of bridges: both stopped ones started with one reason, each through `bridge start`, each recorded
    page.goto(base + "/bridges")
    for bid in (busy, new_bid):
        page.check(f"#select-bridge-{bid}")
    page.fill("#bridges-why", "console test: back on")
    page.click("#bridges-start")
    assert "Done." in page.inner_text("#result")
    shot(page, "selected")
    started = {b["id"]: b["started"] for b in cli_json(node, "bridge", "list")}
    assert started[busy] is True and started[new_bid] is True
    assert [(e["action"], e["target"]) for e in operator_log(node)[-2:]] == [
        ("console bridge start", str(busy)), ("console bridge start", str(new_bid))]
    # the new bridge destroyed as a selection of one, then its channel, confirmed with its id
    page.goto(base + "/bridges")
    page.check(f"#select-bridge-{new_bid}")
    page.fill("#bridges-why", "console test: clean up")
    page.click("#bridges-destroy")
    assert "Done." in page.inner_text("#result")
    assert new_bid not in {b["id"] for b in cli_json(node, "bridge", "list")}
    page.goto(f"{base}/channels/{new_cid}")
    page.fill("#confirm_id", str(new_cid))
    page.fill("#channel-destroy-why", "console test: clean up")
    page.click("#channel-destroy")
    page.wait_for_load_state()
    assert page.url.startswith(base + "/channels")
    assert new_cid not in {c["id"] for c in cli_json(node, "channel", "list")}
    assert operator_log(node)[-1]["action"] == "console channel destroy"

    # the ledger audit: what `nsjms audit --incremental` stored, shown read only with the same figures
    out = node.state_dir.parent / "audit-incremental"
    code, printed, err = cli(node, "audit", "--incremental", "--grace", "3600", "--out", str(out))
    assert code == 0, printed + err
    report = json.loads((out / "incremental.json").read_text())
    page.goto(base + "/audit/days")
    shown = page.request.get(base + "/audit/days?format=json").json()
    assert shown["error"] is None
    assert [(d["day"], d["verdict"], d["rows"]) for d in shown["days"]] == [
        (d["day"], d["verdict"], d["rows"]) for d in sorted(report["days"], key=lambda d: d["day"], reverse=True)]
    busy_rows = [b for b in shown["bridges"] if b["bridge_id"] == busy]
    assert busy_rows and busy_rows[0]["delivered"] == sum(
        g["obligations"] for d in report["days"] for g in d["groups"]
        if g["bridge_id"] == busy and g["status"] in ("delivered", "duplicated")) >= 40
    assert report["days"][0]["verdict"] in page.inner_text("#audit-days")
    page.wait_for_selector("#audit-chart canvas", timeout=30_000)   # the days' chart (the page's own JSON)
    assert "delivered" in page.inner_text("#audit-chart") and "lost" in page.inner_text("#audit-chart")
    shot(page, "auditdays")

    page.goto(base + "/audit")
    assert "console test: finish the logged commit" in page.inner_text("#audit")
    shot(page, "audit")
    text = (node.state_dir / "txn-operator.log").read_text() + node.stderr_path.read_text()
    for name in ("operator", "reader"):
        assert secret(node, name) not in text, "a secret was logged"
