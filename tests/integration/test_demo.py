"""``nsjms demo`` is restartable: runs on one node do not pile up channels and bridges, leftovers are removed.

Real node (IIOP, PostgreSQL, ActiveMQ over STOMP); the demo runs as its own process, as users run it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bridgekit import bridge_factory
from conftest import NsjmsServer
from stdclients import wait_until

REPO = Path(__file__).resolve().parents[2]
COUNT = 6


def _argv(state_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "router.cli", "demo", "--state-dir", str(state_dir), "--rate", "20", *extra]


def _demo(state_dir: Path) -> dict[str, Any]:
    done = subprocess.run(_argv(state_dir, "--count", str(COUNT), "--json"), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "<- received" not in done.stdout, "no per-event progress when stdout is not a terminal"
    return dict(json.loads(done.stdout))  # stdout is the JSON summary only (issue 29)


def _background(state_dir: Path) -> subprocess.Popen[bytes]:
    with open(state_dir / "demo-background.log", "ab") as log:
        return subprocess.Popen(_argv(state_dir, "--count", "0"), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                cwd=REPO)


def _runs(state_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state_dir / "demo.json").read_text())["runs"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return {}


def _run_of(state_dir: Path, pid: int) -> dict[str, Any] | None:
    return next((r for r in _runs(state_dir).values() if r["pid"] == pid and len(r["bridges"]) == 2), None)


def _counts(factory: Any, bf: Any) -> tuple[int, int]:
    return len(factory.get_all_channels()), len(bf.get_all_bridges())


def test_demo_twice_does_not_grow_and_receives_every_alarm(nsjms_server: NsjmsServer, factory: Any,
                                                           client_orb: Any) -> None:
    state = nsjms_server.state_dir
    bf = bridge_factory(client_orb, nsjms_server)
    baseline = _counts(factory, bf)
    first = _demo(state)
    assert (first["pushed"], first["received"]) == (COUNT, COUNT), first
    assert _counts(factory, bf) == baseline, "the first run removed its channels and bridges"
    second = _demo(state)
    assert (second["pushed"], second["received"]) == (COUNT, COUNT), second
    assert second["queue"] == first["queue"], "a restart reuses the node's demo queue"
    assert _counts(factory, bf) == baseline


def test_leftovers_of_a_killed_demo_are_removed_even_without_their_channel(nsjms_server: NsjmsServer,
                                                                           factory: Any, client_orb: Any) -> None:
    state = nsjms_server.state_dir
    bf = bridge_factory(client_orb, nsjms_server)
    baseline = _counts(factory, bf)
    killed = _background(state)
    try:
        assert wait_until(lambda: _run_of(state, killed.pid) is not None, 60), "the demo started"
    finally:
        killed.kill()
        killed.wait(timeout=30)
    left = _run_of(state, killed.pid)
    assert left is not None
    assert _counts(factory, bf) == (baseline[0] + 2, baseline[1] + 2), "a killed demo leaves its objects"
    factory.get_event_channel(left["channels"][1]).destroy()  # a leftover bridge whose channel is gone

    again = _demo(state)
    assert sorted(again["removed_bridges"]) == sorted(left["bridges"]), again
    assert sorted(again["removed_channels"]) == [left["channels"][0]], again
    assert (again["pushed"], again["received"]) == (COUNT, COUNT), again
    assert _counts(factory, bf) == baseline


def test_two_demos_at_once_use_their_own_queues(nsjms_server: NsjmsServer, factory: Any, client_orb: Any) -> None:
    state = nsjms_server.state_dir
    bf = bridge_factory(client_orb, nsjms_server)
    baseline = _counts(factory, bf)
    running = _background(state)
    try:
        assert wait_until(lambda: _run_of(state, running.pid) is not None, 60), "the first demo started"
        first = _run_of(state, running.pid)
        assert first is not None
        second = _demo(state)
        assert second["queue"] != first["queue"]
        assert (second["pushed"], second["received"]) == (COUNT, COUNT), second
        assert second["removed_bridges"] == [] and set(first["bridges"]) <= set(bf.get_all_bridges()), \
            "a running demo's bridges are left alone"
    finally:
        running.send_signal(signal.SIGTERM)
        code = running.wait(timeout=60)
    assert code == 0, (state / "demo-background.log").read_text()
    assert _counts(factory, bf) == baseline, "SIGTERM (as from serve --demo) removes the demo's objects"


def _bridge_factory_after_restart(client_orb: Any, server: NsjmsServer) -> Any:
    """The client ORB may hold a connection to the previous server on the same port: the first call over it fails
    with COMM_FAILURE (as ``ClientOrb.factory`` handles for the channel factory)."""
    from omniORB import CORBA

    for _ in range(5):
        try:
            bf = bridge_factory(client_orb, server)
            bf.get_all_bridges()
            return bf
        except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
            continue
    return bridge_factory(client_orb, server)


def test_serve_demo_restarted_does_not_add_bridges(tmp_path: Path, fresh_db: str, broker_url: str,
                                                   client_orb: Any) -> None:
    """Issue 11: each restart of `serve --demo` added a pair of bridges competing for the demo queue."""
    from conftest import free_port

    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
    plain = server.command
    server.command = lambda: [*plain(), "--demo", "--demo-rate", "20"]  # type: ignore[method-assign]
    try:
        for restart in range(2):
            server.start()
            bf = _bridge_factory_after_restart(client_orb, server)
            assert wait_until(lambda: any(len(r["bridges"]) == 2 for r in _runs(state).values()), 60), \
                f"the demo of start {restart + 1} did not come up"
            run = next(iter(_runs(state).values()))
            assert sorted(bf.get_all_bridges()) == sorted(run["bridges"]), f"start {restart + 1}: only its bridges"
            server.stop()
            assert _runs(state) == {}, "serve stopped its demo, which removed its objects"
    finally:
        server.stop()
