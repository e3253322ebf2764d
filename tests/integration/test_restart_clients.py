"""What a CORBA client sees across an orderly restart of the node (issue 29; docs/operations.md, "What a client
sees across a restart").

The node's SIGTERM stop ends with ``orb.shutdown(True)`` / ``orb.destroy()``, which closes every connection clients
pooled with a GIOP CloseConnection message. A standard omniORB client (its own process, default settings) then
retries its next calls on new connections by itself: every call after the restart succeeds. A client ORB with
``-ORBclientCallTimeOutPeriod`` (omniORB 4.3) does not act on the CloseConnection: each pooled connection fails
its next call once with ``COMM_FAILURE_WaitingForReply, COMPLETED_MAYBE`` (the second test pins that down, so the
documentation stays true)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NsjmsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLIENT = r"""
import sys, threading
import omniORB
from omniORB import CORBA
import CosNotifyChannelAdmin
orb = CORBA.ORB_init(["client", *sys.argv[2:]], CORBA.ORB_ID)
factory = orb.string_to_object(sys.argv[1])._narrow(CosNotifyChannelAdmin.EventChannelFactory)
barrier = threading.Barrier(4)
def call():
    barrier.wait(timeout=60)
    factory.get_all_channels()
threads = [threading.Thread(target=call) for _ in range(4)]  # concurrent calls: several pooled connections
[t.start() for t in threads]
[t.join() for t in threads]
print("pooled", flush=True)
sys.stdin.readline()                                         # the node restarts meanwhile
for i in range(6):
    try:
        factory.get_all_channels()
        print("ok", flush=True)
    except CORBA.COMM_FAILURE as exc:
        print("COMM_FAILURE", exc.minor == omniORB.COMM_FAILURE_WaitingForReply, exc.completed == CORBA.COMPLETED_MAYBE,
              flush=True)
"""


def _across_a_restart(server: NsjmsServer, *orb_args: str) -> list[str]:
    client = subprocess.Popen([sys.executable, "-c", CLIENT, server.corbaloc(), *orb_args], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "pooled"
        assert server.stop() == 0, "an orderly stop (SIGTERM) exits 0"
        server.restart()
        out, err = client.communicate("\n", timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 0, err
    return out.split("\n")[:-1]


def test_a_standard_client_goes_on_transparently_after_an_orderly_restart(nsjms_server: NsjmsServer) -> None:
    assert _across_a_restart(nsjms_server) == ["ok"] * 6


def test_a_client_with_a_call_timeout_sees_one_comm_failure_per_pooled_connection(nsjms_server: NsjmsServer) -> None:
    lines = _across_a_restart(nsjms_server, "-ORBclientCallTimeOutPeriod", "30000")
    failures = [line for line in lines if line != "ok"]
    assert set(failures) <= {"COMM_FAILURE True True"}, lines
    assert 1 <= len(failures) <= 4 and lines[-1] == "ok", lines  # at most one per pooled connection, then ok
