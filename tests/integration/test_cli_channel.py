"""``nsjms channel …`` and ``nsjms bridge list``/``status`` against a real node (IIOP, PostgreSQL, ActiveMQ).

The channel tests share one node (``module_server``: each reads only the channels it made or names); the bridge
tests, which assert over the node's whole bridge list, have a node each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyFilter

from router.cli.channel import _node_refusal

from conftest import NsjmsServer
from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    obtain_proxy_supplier,
    persistent_qos,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "router.cli", *args, "--state-dir", str(state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=REPO)


def test_channel_create_list_show_destroy(module_server: NsjmsServer, shared_factory: Any, client_orb: Any) -> None:
    state = module_server.state_dir
    done = _cli(state, "channel", "create", "--json", "--qos", "EventReliability=Persistent",
                "--qos", "ConnectionReliability=Persistent", "--qos", "OrderPolicy=FifoOrder",
                "--admin", "MaxQueueLength=500")
    assert done.returncode == 0, done.stderr
    cid = json.loads(done.stdout)["id"]
    channel = shared_factory.get_event_channel(cid)
    qos = {p.name: p.value.value() for p in channel.get_qos()}
    assert (qos["EventReliability"], qos["ConnectionReliability"], qos["OrderPolicy"]) == (1, 1, 1)
    assert {p.name: p.value.value() for p in channel.get_admin()}["MaxQueueLength"] == 500

    # a consumer with a filter, so that show has an admin, a proxy, its state and a constraint to print
    admin, aid = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    proxy, pid = obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PUSH)
    flt = channel._get_default_filter_factory().create_filter("EXTENDED_TCL")
    flt.add_constraints([CosNotifyFilter.ConstraintExp([CosNotification.EventType("Telecom", "*")],
                                                       "$severity == 'major'")])
    proxy.add_filter(flt)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)

    listed = _cli(state, "--json", "channel", "list")
    assert listed.returncode == 0, listed.stderr
    assert cid in [row["id"] for row in json.loads(listed.stdout)]

    def shown() -> dict[str, Any]:
        out = _cli(state, "channel", "show", str(cid), "--json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    assert wait_until(lambda: any(p.get("connected") for a in shown()["consumer_admins"] for p in a["proxies"]),
                      15), "the status snapshot shows the proxy connected"
    detail = shown()
    assert detail["qos"]["EventReliability"] == 1 and detail["admin"]["MaxQueueLength"] == 500
    adm = next(a for a in detail["consumer_admins"] if a["id"] == aid)
    prox = next(p for p in adm["proxies"] if p["id"] == pid)
    assert prox["type"] == "PUSH_STRUCTURED" and prox["queued"] == 0 and prox["connected"] is True
    assert prox["filters"][0]["constraints"][0]["expression"] == "$severity == 'major'"
    assert prox["filters"][0]["constraints"][0]["event_types"] == ["Telecom/*"]

    text = _cli(state, "channel", "show", str(cid)).stdout
    assert "EventReliability = 1 (Persistent)" in text and "MaxQueueLength = 500" in text, text
    assert f"proxy {pid} PUSH_STRUCTURED  connected, queued 0" in text, text
    assert "[Telecom/*] $severity == 'major'" in text, text

    gone = _cli(state, "channel", "destroy", str(cid))
    assert gone.returncode == 0 and f"channel {cid} destroyed" in gone.stdout, gone.stderr
    assert cid not in list(shared_factory.get_all_channels())


def test_unknown_channel_is_named(module_server: NsjmsServer, shared_factory: Any) -> None:
    for command in ("show", "destroy"):
        done = _cli(module_server.state_dir, "channel", command, "99999")
        assert done.returncode == 4 and "no channel with id 99999" in done.stderr, done.stdout + done.stderr


def test_refusals_name_the_property_and_the_reason(module_server: NsjmsServer, shared_factory: Any) -> None:
    """A client-side refusal (exit 2, nothing created) and the node's own UnsupportedQoS render the same way."""
    before = list(shared_factory.get_all_channels())
    done = _cli(module_server.state_dir, "channel", "create", "--qos", "EventReliability=Persistent")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--qos EventReliability: UNAVAILABLE_VALUE" in done.stderr
    assert "ConnectionReliability=Persistent" in done.stderr, done.stderr
    assert list(shared_factory.get_all_channels()) == before

    try:
        shared_factory.create_channel([CosNotification.Property("EventReliability", _short(1))], [])
    except CosNotification.UnsupportedQoS as exc:
        lines = _node_refusal("--qos", exc.qos_err)
    else:
        raise AssertionError("the node accepted a persistent channel with best-effort connections")
    assert lines == [line.removeprefix("nsjms channel: refused: ") for line in done.stderr.splitlines()], lines


def _short(v: int) -> Any:
    from omniORB import CORBA

    return CORBA.Any(CORBA.TC_short, v)


def test_bridge_state_is_the_same_in_bridge_list_and_status(nsjms_server: NsjmsServer, factory: Any) -> None:
    state = nsjms_server.state_dir
    _, cid = factory.create_channel(persistent_qos(), [])
    done = _cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:nsjms.test.cli.vocab",
                "--no-start", "--json")
    assert done.returncode == 0, done.stderr
    bid = json.loads(done.stdout)["id"]

    def line_of(text: str) -> str:
        return next((ln for ln in text.splitlines() if ln.startswith(f"bridge {bid}:")), "")  # not yet listed: ""

    assert wait_until(lambda: "[inactive] stopped" in line_of(_cli(state, "status").stdout), 15)
    assert "[inactive] stopped" in line_of(_cli(state, "bridge", "list").stdout)
    assert _cli(state, "bridge", "start", str(bid)).returncode == 0
    assert wait_until(lambda: "[active]" in line_of(_cli(state, "status").stdout), 20)
    assert "[active]" in line_of(_cli(state, "bridge", "list").stdout)
    rows = json.loads(_cli(state, "bridge", "list", "--json").stdout)
    assert [(r["id"], r["state"]) for r in rows] == [(bid, "active")]


def test_node_found_from_any_directory_by_the_environment(module_server: NsjmsServer, tmp_path: Path) -> None:
    import os

    env = dict(os.environ, NSJMS_STATE_DIR=str(module_server.state_dir), PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "router.cli", "status", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["endpoints"]["pid"] == module_server.pid


def test_bridge_refusals_carry_the_reason(nsjms_server: NsjmsServer, factory: Any) -> None:
    """Issue 11: `bridge create --factory bogus` said only INVALID_JMSDESTINATION "(see the node log for why)"."""
    state = nsjms_server.state_dir
    _, cid = factory.create_channel([], [])             # BestEffort: the queue refusal below needs it
    bogus = _cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:nsjms.test.cli.bogus",
                 "--factory", "bogus")
    assert bogus.returncode == 2, bogus.stdout + bogus.stderr  # a value wrong by itself: usage (issue 29)
    assert "INVALID_JMSDESTINATION: unknown connection factory profile 'bogus'" in bogus.stderr, bogus.stderr
    selector = _cli(state, "bridge", "create", "--from", "queue:nsjms.test.cli.sel", "--to", f"channel:{cid}",
                    "--factory", "default;selector=region = ")
    assert selector.returncode == 2, selector.stdout + selector.stderr
    assert "invalid source endpoint: INVALID_JMSDESTINATION: invalid JMS selector 'region ='" in selector.stderr
    name = _cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:bad name")
    assert name.returncode == 2 and "is empty or not a plain name" in name.stderr, name.stdout + name.stderr
    gone = _cli(state, "bridge", "create", "--from", "channel:99999", "--to", "queue:nsjms.test.cli.bogus")
    assert gone.returncode == 4 and "INVALID_CHANNELID: no event channel with id 99999" in gone.stdout, gone.stdout
    best_effort = _cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:nsjms.test.cli.be")
    assert best_effort.returncode == 4, best_effort.stdout + best_effort.stderr
    assert "INVALID_JMSDESTINATION: queue nsjms.test.cli.be with channel" in best_effort.stdout, best_effort.stdout
    assert "ConnectionReliability is BestEffort" in best_effort.stdout, best_effort.stdout
    assert "no bridges" in _cli(state, "bridge", "list").stdout


def test_a_bridge_whose_channel_is_gone_is_named_and_can_be_destroyed(nsjms_server: NsjmsServer,
                                                                     factory: Any) -> None:
    state = nsjms_server.state_dir
    channel, cid = factory.create_channel(persistent_qos(), [])
    done = _cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:nsjms.test.cli.gone", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    bid = json.loads(done.stdout)["id"]
    channel.destroy()
    gone = f"[inactive] channel {cid} no longer exists: destroy this bridge"
    assert gone in _cli(state, "bridge", "list").stdout
    assert wait_until(lambda: gone in _cli(state, "status").stdout, 15), _cli(state, "status").stdout
    assert _cli(state, "bridge", "destroy", str(bid)).returncode == 0
    assert "no bridges" in _cli(state, "bridge", "list").stdout
