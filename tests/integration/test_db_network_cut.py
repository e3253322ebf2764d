"""A silent network cut between the node and PostgreSQL (issue 31): packets dropped, no reset, no FIN.

PostgreSQL runs in a network namespace of its own, reached over a veth pair; the cut sets the node's end of the
pair down, so every packet either way is dropped silently (the kernel sends nothing back: no RST, no ICMP) until it
comes back up. Four standard-stub CORBA suppliers push persistent structured events into a Persistent channel
(each push a separate event, never retried) whose channel -> JMS bridge sends them to a queue, counted at an
independent stomp.py consumer by ``$event_name``.

Asserted (docs/channel.md "Database unavailable", the network cut):

* every push answers within the documented bound: the suppliers' call timeout is that bound, and every failed push
  carries the node's own answer (``TRANSIENT``, minor ``MINOR_STORE_UNAVAILABLE``), never the client's timeout;
* no event whose push failed with ``COMPLETED_NO`` ever reaches JMS (before: pushes queued behind a stuck commit
  were stored when the network came back, long after their suppliers were told they failed: one event 6 times);
* every event whose push returned reaches JMS, exactly once (0 lost, 0 duplicates); an event whose push answered
  ``COMPLETED_MAYBE`` arrives at most once;
* every supplier has a push accepted again within the documented bound after the network returns;
* ``status.json`` is rewritten during the cut (never older than the 10 s after which ``nsjms status`` calls it
  stale), and ``nsjms txn list`` answers during the cut.

Needs root (network namespaces): a machine without them fails the test (never a skip).
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import stomp
from netcut import ip as _ip

import omniORB
from omniORB import CORBA

from idl.generated import CosBridgeAdmin as BA
from router.channel.boundary import MINOR_STORE_TIMEOUT, MINOR_STORE_UNAVAILABLE
from router.node.services import PG_OS_USER, EmbeddedPostgres

from bridgekit import bridge_factory, channel_ep, jms_ep, persistent_channel, structured_supplier, unique_name
from conftest import NsjmsServer, free_port, restart_port
from stdclients import make_event, wait_until

pytestmark = pytest.mark.integration

#: docs/channel.md: a push answers within this long whatever the network does (the suppliers' call timeout here).
PUSH_BOUND_S = 15.0
#: docs/channel.md: after the network returns, pushes are accepted again within this long.
RESUME_BOUND_S = 15.0
#: The cut lasts longer than the push bound (the suppliers' call timeout) and the 10 s after which status.json is
#: stale, so a push parked behind a stuck commit, or a status loop waiting on the database, shows.
CUT_S = 18.0
SUPPLIERS = 4
TXN_LIST_BOUND_S = 30.0       # `nsjms txn list` answers (the node's T2 view) during the cut
SETTLE_S = 120.0
STALE_AFTER_S = 10.0          # router/node/status.py STALE_AFTER_S


class NetnsPostgres(EmbeddedPostgres):
    """An embedded PostgreSQL started inside network namespace ``ns``, listening on ``addr`` only."""

    def __init__(self, base: Path, port: int, ns: str, addr: str) -> None:
        super().__init__(base, port)
        self.ns, self.addr = ns, addr

    def _run(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        prefix = ["ip", "netns", "exec", self.ns] + (["runuser", "-u", PG_OS_USER, "--"] if os.geteuid() == 0 else [])
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=self.timeout + 30,
                              stdin=subprocess.DEVNULL, check=False, umask=0o077)

    def _initdb(self) -> None:
        super()._initdb()
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 10.0.0.0/8 scram-sha-256\n")

    def _server_options(self) -> str:
        return super()._server_options().replace("listen_addresses=127.0.0.1", f"listen_addresses={self.addr}")

    def _make_dsn(self) -> str:
        return super()._make_dsn().replace("@127.0.0.1:", f"@{self.addr}:")


@dataclass
class CutNetwork:
    pg: NetnsPostgres
    host_if: str

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_if, "up")


@pytest.fixture
def cut_pg() -> Iterator[CutNetwork]:
    tag = secrets.token_hex(3)
    ns, host_if, pg_if = f"nsjmscut{tag}", f"nch{tag}", f"ncp{tag}"
    third, fourth = secrets.randbelow(256), secrets.randbelow(64) * 4
    host_addr, pg_addr = f"10.231.{third}.{fourth + 1}", f"10.231.{third}.{fourth + 2}"
    _ip("netns", "add", ns)
    base = Path(tempfile.mkdtemp(prefix="nsjms-test-cutpg-"))
    base.chmod(0o755)                      # the postgres OS user must reach the cluster directory
    pg = NetnsPostgres(base, restart_port(), ns, pg_addr)
    try:
        _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", pg_if)
        _ip("link", "set", pg_if, "netns", ns)
        _ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("addr", "add", f"{pg_addr}/30", "dev", pg_if, ns=ns)
        _ip("link", "set", pg_if, "up", ns=ns)
        pg.start()
        yield CutNetwork(pg, host_if)
    finally:
        subprocess.run(["ip", "link", "set", host_if, "up"], capture_output=True, check=False)
        try:
            pg.stop()
        finally:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            shutil.rmtree(base, ignore_errors=True)


class Counter(stomp.ConnectionListener):  # type: ignore[misc]
    """An independent JMS consumer: every message's event number and dedupe id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[int, str]] = []

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.seen.append((int(frame.headers["$event_name"][1:]), frame.headers.get("nsjms_dedupe_id", "")))

    def counts(self) -> collections.Counter[int]:
        with self.lock:
            return collections.Counter(n for n, _ in self.seen)


@dataclass
class Supplier:
    """Pushes events ``base``, ``base + 1``, ...; each once, whatever the answer; records each answer."""

    client: Any
    base: int
    ok: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)            # COMPLETED_NO: must never arrive
    maybe: list[int] = field(default_factory=list)              # COMPLETED_MAYBE: at most once
    foreign: list[str] = field(default_factory=list)            # failures that are not the node's own answer
    accepted_at: list[float] = field(default_factory=list)
    slowest: float = 0.0                                        # the longest push (answered either way), s
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = self.base
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                self.client.push_one(make_event(i))
            except CORBA.TRANSIENT as exc:
                if exc.minor not in (MINOR_STORE_UNAVAILABLE, MINOR_STORE_TIMEOUT):
                    self.foreign.append(f"event {i}: {exc!r} minor {exc.minor:#x}")
                (self.maybe if exc.completed == CORBA.COMPLETED_MAYBE else self.refused).append(i)
            except CORBA.SystemException as exc:
                self.foreign.append(f"event {i}: {exc!r}")
                self.maybe.append(i)
            else:
                self.ok.append(i)
                self.accepted_at.append(time.monotonic())
            self.slowest = max(self.slowest, time.monotonic() - began)
            i += 1
            time.sleep(0.02)


def _status_time(state: Path) -> float:
    try:
        return float(json.loads((state / "status.json").read_text())["time"])
    except (OSError, ValueError, KeyError):
        return 0.0


def test_a_silent_network_cut_to_postgres_answers_in_time_and_completes_no_abandoned_push(
        tmp_path: Path, cut_pg: CutNetwork, broker_url: str, client_orb: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=cut_pg.pg.dsn, broker_url=broker_url, port=free_port())
    server.start()
    parts = urlsplit(broker_url)
    stomp_conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    counter = Counter()
    suppliers: list[Supplier] = []
    threads: list[threading.Thread] = []
    try:
        factory = client_orb.factory(server.corbaloc())
        channel, cid = persistent_channel(factory)
        queue = unique_name("nsjms.test.cut")
        bf = bridge_factory(client_orb, server)
        bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
        bridge.start_bridge()
        stomp_conn.set_listener("counter", counter)
        stomp_conn.connect(wait=True)
        stomp_conn.subscribe(f"/queue/{queue}", id="1", ack="auto")
        for k in range(SUPPLIERS):
            client = structured_supplier(channel)
            omniORB.setClientCallTimeout(client.proxy, int(PUSH_BOUND_S * 1000))
            suppliers.append(Supplier(client, (k + 1) * 1_000_000))
        threads = [threading.Thread(target=s.run, daemon=True) for s in suppliers]
        for t in threads:
            t.start()
        assert wait_until(lambda: sum(counter.counts().values()) >= 20, 60), "no traffic before the cut"

        cut_pg.cut()
        cut_at = time.monotonic()
        status_ages: list[float] = []
        txn_list: list[str] = []                 # its exit code, or that it did not answer in time
        asked = False

        def ask_txn_list() -> None:
            try:
                done = subprocess.run([sys.executable, "-m", "router.cli", "--state-dir", str(state), "txn", "list"],
                                      capture_output=True, text=True, timeout=TXN_LIST_BOUND_S, check=False)
                txn_list.append(f"exit {done.returncode}")
            except subprocess.TimeoutExpired:
                txn_list.append(f"no answer within {TXN_LIST_BOUND_S:g} s")

        while time.monotonic() - cut_at < CUT_S:
            status_ages.append(time.time() - _status_time(state))
            if not asked and time.monotonic() - cut_at > 5:
                asked = True
                threading.Thread(target=ask_txn_list, daemon=True).start()
            time.sleep(0.5)
        ok_during = {id(s): len(s.ok) for s in suppliers}
        cut_pg.restore()
        back_at = time.monotonic()

        assert wait_until(lambda: bool(txn_list), TXN_LIST_BOUND_S + 10)
        def resumed_all() -> bool:        # each supplier has pushes accepted again
            return all(len(s.ok) > ok_during[id(s)] + 3 for s in suppliers)

        assert wait_until(resumed_all, 60), "traffic did not resume"
        for s in suppliers:
            s.stop.set()
        for t in threads:
            t.join(PUSH_BOUND_S + 10)
            assert not t.is_alive()

        ok = {i for s in suppliers for i in s.ok}
        refused = {i for s in suppliers for i in s.refused}
        maybe = {i for s in suppliers for i in s.maybe}
        assert wait_until(lambda: ok <= set(counter.counts()), SETTLE_S), \
            f"lost: {len(ok - set(counter.counts()))} accepted event(s) never reached JMS"
        time.sleep(3.0)                   # anything completed late or twice would arrive now
        counts = counter.counts()
        foreign = [f for s in suppliers for f in s.foreign]
        resumed = [min(t for t in s.accepted_at if t > back_at) - back_at for s in suppliers]
        print(f"network cut {CUT_S:.0f} s: accepted {len(ok)}, refused (COMPLETED_NO) {len(refused)}, "
              f"COMPLETED_MAYBE {len(maybe)}, received {sum(counts.values())}; slowest push "
              f"{max(s.slowest for s in suppliers):.1f} s; pushes accepted again "
              f"{', '.join(f'{r:.1f}' for r in resumed)} s after the network returned; status.json at most "
              f"{max(status_ages):.1f} s old during the cut; txn list during the cut: {txn_list}")
        assert not foreign, f"pushes not answered by the node within {PUSH_BOUND_S:g} s: {foreign[:5]}"
        assert refused, "the cut produced no refused push: the test did not exercise it"
        assert not refused & set(counts), \
            f"events told COMPLETED_NO reached JMS anyway: {sorted(refused & set(counts))[:10]}"
        dups = {i: n for i, n in counts.items() if n > 1}
        assert not dups, f"duplicates at JMS: {dict(list(dups.items())[:10])}"
        assert set(counts) <= ok | maybe, "an event nobody pushed arrived"
        assert max(resumed) <= RESUME_BOUND_S, f"traffic resumed {max(resumed):.1f} s after the network returned"
        assert max(status_ages) <= STALE_AFTER_S, f"status.json went {max(status_ages):.1f} s without a rewrite"
        assert txn_list in (["exit 0"], ["exit 1"]), f"nsjms txn list during the cut: {txn_list}"
    finally:
        for s in suppliers:
            s.stop.set()
        cut_pg.restore()
        for t in threads:
            t.join(PUSH_BOUND_S + 10)
        if stomp_conn.is_connected():
            stomp_conn.disconnect()
        server.stop()
