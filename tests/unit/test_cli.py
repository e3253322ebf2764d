"""The command line without a node: global options, state-directory discovery, channel QoS checks, vocabulary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar

import pytest

from router import cli
from router.channel import qos as Q
from router.cli.bridge import bridge_state
from router.cli.channel import PropertyRefused, check_admin, check_qos, parse_assignments
from router.cli.demo import free_slot, live_runs, queue_name
from router.node.status import render


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NSJMS_STATE_DIR", "NSJMS_CONFIG", "NSJMS_NODE_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)


def _parse(*argv: str) -> argparse.Namespace:
    args = cli.build_parser().parse_args(argv)
    for key, default in cli.GLOBAL_DEFAULTS.items():
        if not hasattr(args, key):
            setattr(args, key, default)
    return args


@pytest.mark.parametrize("argv", [
    ["--state-dir", "/x", "--json", "channel", "list"],
    ["channel", "--state-dir", "/x", "--json", "list"],
    ["channel", "list", "--state-dir", "/x", "--json"],
    ["--json", "channel", "list", "--state-dir", "/x"],
])
def test_global_options_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = _parse(*argv)
    assert (args.state_dir, args.json, args.command, args.channel_command) == (Path("/x"), True, "channel", "list")


@pytest.mark.parametrize("command", [["serve"], ["status"], ["demo"], ["bridge", "list"], ["bridge", "stop", "3"],
                                     ["channel", "show", "1"], ["channel", "create"]])
def test_every_subcommand_accepts_the_global_options_on_both_sides(command: list[str]) -> None:
    after = _parse(*command, "--state-dir", "/s", "--config", "c.toml", "--json")
    before = _parse("--state-dir", "/s", "--config", "c.toml", "--json", *command)
    for args in (after, before):
        assert (args.state_dir, args.config, args.json) == (Path("/s"), "c.toml", True)


def test_defaults_when_no_global_option_is_given() -> None:
    args = _parse("status")
    assert (args.state_dir, args.config, args.json) == (None, None, False)


def test_status_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NSJMS_STATE_DIR", str(tmp_path / "nowhere"))
    assert cli.main(["status"]) == cli.EXIT_NOT_RUNNING
    err = capsys.readouterr().err
    assert str(tmp_path / "nowhere" / "endpoints.json") in err and "from $NSJMS_STATE_DIR" in err, err
    assert "--state-dir" in err and "node.state_dir" in err


def test_state_dir_from_the_configuration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "nsjms.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "from-config"}"\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bridge", "list", "--config", str(conf)]) == cli.EXIT_NOT_RUNNING
    err = capsys.readouterr().err
    assert str(tmp_path / "from-config") in err and "node.state_dir of the configuration" in err, err


def test_default_state_dir_is_named_with_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--json", "status"]) == cli.EXIT_NOT_RUNNING
    err = capsys.readouterr().err
    assert "default ./.nsjms" in err and str(tmp_path) in err, err


def test_state_dir_option_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NSJMS_STATE_DIR", str(tmp_path / "env"))
    assert cli.main(["channel", "list", "--state-dir", str(tmp_path / "opt")]) == cli.EXIT_NOT_RUNNING
    err = capsys.readouterr().err
    assert str(tmp_path / "opt") in err and "from --state-dir" in err, err


# -- channel create: QoS/admin checked client-side with the channel's rules ------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["--qos", "EventReliability=7"], "--qos EventReliability: BAD_VALUE"),
    (["--qos", "Bogus=1"], "--qos Bogus: BAD_PROPERTY"),
    (["--qos", "StartTime=1"], "--qos StartTime: UNSUPPORTED_PROPERTY"),
    (["--qos", "EventReliability=Persistent"], "ConnectionReliability=Persistent"),
    (["--qos", "Timeout=soon"], "--qos Timeout=soon: BAD_TYPE"),
    (["--qos", "EnableTransaction=maybe"], "BAD_TYPE: expected a boolean"),
    (["--admin", "MaxQueueLength=-1"], "--admin MaxQueueLength: BAD_VALUE"),
    (["--admin", "EventReliability=1"], "--admin EventReliability: BAD_PROPERTY"),
    (["--qos", "EventReliability"], "expected NAME=VALUE"),
])
def test_channel_create_refuses_with_the_property_and_the_reason(
        argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No node is needed to learn that a property is wrong (exit 2, like every usage error)."""
    assert cli.main(["channel", "create", "--state-dir", str(tmp_path), *argv]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert expected in err, err


def test_channel_create_with_valid_properties_needs_a_node(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["channel", "create", "--state-dir", str(tmp_path), "--qos", "EventReliability=Persistent",
            "--qos", "ConnectionReliability=Persistent", "--qos", "Timeout=5s", "--admin", "MaxQueueLength=100"]
    assert cli.main(argv) == cli.EXIT_NOT_RUNNING
    assert "no running node" in capsys.readouterr().err


def test_values_are_parsed_by_the_property_type() -> None:
    values = parse_assignments(["OrderPolicy=fifoorder", "Timeout=250ms", "EnableTransaction=true", "Priority=-3",
                                "RetryInterval=0x10"], Q.QOS_PROPERTIES, "--qos")
    assert values == {"OrderPolicy": 1, "Timeout": 2_500_000, "EnableTransaction": True, "Priority": -3,
                      "RetryInterval": 16}
    check_qos(values)


def test_client_check_agrees_with_the_channel() -> None:
    """The CLI refuses exactly what the factory's create_channel would refuse (same module, same call)."""
    with pytest.raises(PropertyRefused) as refused:
        check_qos({"EventReliability": 1})
    with pytest.raises(Q.QoSError) as channel:
        Q.apply_qos(Q.channel_defaults(), [("EventReliability", Q.to_any("EventReliability", 1))],
                    Q.Target(Q.Level.CHANNEL), Q.Context())
    assert [p.name for p in channel.value.problems] == ["EventReliability"]
    assert len(refused.value.messages) == len(channel.value.problems)
    check_admin({"MaxQueueLength": 10, "RejectNewEvents": True})


# -- one vocabulary for a bridge's state ---------------------------------------------------------------------
def test_bridge_state_vocabulary() -> None:
    assert bridge_state({"state": "active", "started": True, "reason": None}) == "[active]"
    assert bridge_state({"state": "inactive", "started": False, "reason": "stopped"}) == "[inactive] stopped"
    assert bridge_state({"state": "inactive", "started": True, "reason": "broker down"}) == \
        "[inactive] started, broker down; reconnecting"
    assert bridge_state({"state": "inactive", "started": True, "reason": "channel not connected"}) == \
        "[inactive] started, channel not connected; reconnecting"
    assert bridge_state({"state": "inactive", "started": True, "reason": "channel gone", "channel_id": 3}) == \
        "[inactive] channel 3 no longer exists: destroy this bridge"
    assert bridge_state({"started": False}) == "[inactive] stopped", "no snapshot row, administratively stopped"
    assert bridge_state({"started": True}).startswith("[unknown] started"), "never [active] without the node's word"


@pytest.mark.parametrize(("snap_state", "started", "reason", "shown"), [
    ("active", True, None, "[active]"),
    ("inactive", True, "broker down", "[inactive] started, broker down; reconnecting"),
    ("inactive", False, "stopped", "[inactive] stopped"),
])
def test_status_renders_bridges_with_the_same_words_as_bridge_list(snap_state: str, started: bool,
                                                                    reason: str | None, shown: str) -> None:
    bridge = {"id": 4, "source": "channel:1", "sink": "queue:q", "state": snap_state, "started": started,
              "reason": reason, "channel_id": 1, "broker": "connected", "channel_connected": True, "forwarded": 0,
              "dead_lettered": 0, "duplicates_suppressed": 0}
    report: dict[str, Any] = {"endpoints": {"event_channel_factory": {"corbaloc": "corbaloc::x"}},
                              "snapshot": {"bridges": [bridge]}, "channel_ids": [1], "stale": False}
    line = next(ln for ln in render(report).splitlines() if ln.startswith("bridge 4"))
    assert shown in line and line.count("[") == 1, line
    assert bridge_state(bridge) == shown, "bridge list renders the same row the same way"


def test_a_bridge_whose_channel_is_gone_is_reported_as_such() -> None:
    bridge = {"id": 2, "source": "PUSH structured_event channel 7", "sink": "PUSH queue q", "state": "inactive",
              "started": True, "reason": "channel not connected", "channel_id": 7, "broker": "connected",
              "channel_connected": False, "forwarded": 0,
              "dead_lettered": 0, "duplicates_suppressed": 0}
    report: dict[str, Any] = {"endpoints": {"event_channel_factory": {"corbaloc": "corbaloc::x"}},
                              "snapshot": {"bridges": [bridge]}, "channel_ids": [1, 2], "stale": False}
    line = next(ln for ln in render(report).splitlines() if ln.startswith("bridge 2"))
    assert "[inactive] channel 7 no longer exists: destroy this bridge" in line, line
    report["channel_ids"] = [7]
    assert "[inactive] started, channel not connected; reconnecting" in render(report)


def test_status_shows_the_resend_scheduler_of_an_ack_proxy_with_readable_times() -> None:
    proxy = {"admin": 0, "id": 3, "kind": "PUSH_STRUCTURED", "connected": True, "suspended": False, "queued": 1,
             "in_flight": 1, "retries_used": 2, "resends": 5, "checked_at": 1_700_000_000.25, "next_resend_at": None}
    report: dict[str, Any] = {"endpoints": {"event_channel_factory": {"corbaloc": "corbaloc::x"}},
                              "snapshot": {"channels": [{"id": 1, "events_held": 1, "proxy_suppliers": [proxy]}]},
                              "channel_ids": [1], "stale": False}
    line = next(ln for ln in render(report).splitlines() if ln.startswith("  admin 0 proxy 3"))
    assert "in_flight=1 retries_used=2 resends=5 checked_at=22:13:20.250Z next_resend_at=None" in line, line


@pytest.mark.parametrize(("txn", "expected"), [
    ({"in_doubt": 0, "oldest_in_doubt_s": None, "recovery_passes": 3, "outbox": 0, "inbox": 12},
     "transactions 0 in doubt; recovery passes 3; outbox 0 rows, inbox 12 rows"),
    ({"in_doubt": 2, "oldest_in_doubt_s": 725.4, "recovery_passes": 9, "outbox": 4, "inbox": 0},
     "transactions 2 in doubt (oldest 12m05s): see `nsjms txn list`; recovery passes 9; outbox 4 rows, inbox 0 rows"),
    ({"error": "OperationalError: connection refused"}, "transactions unknown: OperationalError: connection refused"),
])
def test_status_shows_in_doubt_transactions_and_the_oldest_age(txn: dict[str, Any], expected: str) -> None:
    report: dict[str, Any] = {"endpoints": {"event_channel_factory": {"corbaloc": "corbaloc::x"}},
                              "snapshot": {"transactions": txn}, "channel_ids": [], "stale": False}
    assert expected in render(report).splitlines()


# -- demo decisions -------------------------------------------------------------------------------------------
def test_demo_queue_is_per_state_dir_and_slot(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert queue_name(a, 0) == queue_name(a, 0)
    assert len({queue_name(a, 0), queue_name(b, 0), queue_name(a, 1)}) == 3


def test_demo_reuses_the_slot_of_ended_runs() -> None:
    runs = {"r1": {"pid": 1, "slot": 0}, "r2": {"pid": 2, "slot": 1}}
    assert free_slot(live_runs(runs, alive=lambda pid: False)) == 0          # a restart: same queue again
    assert free_slot(live_runs(runs, alive=lambda pid: pid == 1)) == 1       # slot 0 busy: the next one
    assert free_slot(live_runs(runs, alive=lambda pid: True)) == 2


@pytest.mark.parametrize(("isatty", "flag", "progress"), [(True, [], True), (False, [], False),
                                                          (False, ["--progress"], True), (True, ["--quiet"], False)])
def test_demo_progress_only_on_a_terminal(isatty: bool, flag: list[str], progress: bool, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import router.cli.demo

    (tmp_path / "endpoints.json").write_text("{}")
    seen: dict[str, Any] = {}

    def fake_run_demo(state_dir: Path, **kw: Any) -> router.cli.demo.DemoResult:
        seen.update(kw)
        return router.cli.demo.DemoResult(run="r", queue="q", pushed=1, received=1)

    monkeypatch.setattr(router.cli.demo, "run_demo", fake_run_demo)
    monkeypatch.setattr("sys.stdout.isatty", lambda: isatty)
    monkeypatch.setattr("signal.signal", lambda *a: None)
    assert cli.main(["demo", "--count", "1", "--state-dir", str(tmp_path), *flag]) == cli.EXIT_OK
    assert (seen["progress"] is not None) is progress


@pytest.mark.parametrize("command", [["channel", "list"], ["bridge", "list"]])
def test_private_node_files_are_reported_not_a_traceback(command: list[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import router.cli.bridge
    import router.cli.channel

    (tmp_path / "endpoints.json").write_text("{}")

    def private(*args: Any, **kw: Any) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(router.cli.channel, "run", private)
    monkeypatch.setattr(router.cli.bridge, "run", private)
    assert cli.main([*command, "--state-dir", str(tmp_path)]) == cli.EXIT_FAILURE
    assert "run as the node's user" in capsys.readouterr().err


def test_status_shows_the_dead_letters_of_a_pull_style_proxy_consumer() -> None:
    consumer = {"admin": 1, "id": 4, "kind": "PULL_STRUCTURED", "connected": True, "suspended": False,
                "dead_lettered": 1, "last_dead_letter": "d/t/n: BAD_QOS(0x0, CORBA.COMPLETED_NO): bad QoS"}
    report: dict[str, Any] = {"endpoints": {"event_channel_factory": {"corbaloc": "corbaloc::x"}},
                              "snapshot": {"channels": [{"id": 1, "events_held": 0, "proxy_suppliers": [],
                                                         "proxy_consumers": [consumer]}]},
                              "channel_ids": [1], "stale": False}
    line = next(ln for ln in render(report).splitlines() if ln.startswith("  supplier admin 1 proxy 4"))
    assert "dead_lettered=1" in line and "BAD_QOS" in line, line


# -- serve: telemetry is installed once the lock is held, before the first recovery pass ------------------------
class _FakeNode:
    """Stands in for router.node.server.Node: ``start`` takes the lock, calls ``after_lock``, then runs recovery."""

    events: ClassVar[list[str]] = []
    locked = False
    fenced = False

    def __init__(self, settings: Any, *, after_lock: Any = None) -> None:
        self.s, self.after_lock = settings, after_lock
        self.health: dict[str, Any] = {}

    def start(self) -> None:
        from router.node.lifecycle import StateDirLocked

        if self.locked:
            raise StateDirLocked(self.s.state_dir, 1234)
        self.events.append("lock")
        if self.after_lock is not None:
            self.after_lock()
        self.events.append("first recovery pass")

    def wait(self) -> None:
        self.events.append("serving")

    def stop(self, *, start_failed: bool = False) -> None:
        self.events.append("stopped after a failed start" if start_failed else "stopped")


@pytest.fixture
def fake_node(monkeypatch: pytest.MonkeyPatch) -> type[_FakeNode]:
    import router.node.server
    import router.telemetry

    _FakeNode.events, _FakeNode.locked = [], False

    def configure(exporter: str, interval_s: int, **kw: Any) -> Any:
        if kw["address"] == "127.0.0.1:1":
            raise OSError(98, "Address already in use")
        _FakeNode.events.append(f"telemetry {exporter} {kw['address']}")
        return lambda: _FakeNode.events.append("telemetry flushed")

    monkeypatch.setattr(router.node.server, "Node", _FakeNode)
    monkeypatch.setattr(router.telemetry, "configure", configure)
    return _FakeNode


def test_serve_installs_telemetry_before_the_first_recovery_pass(tmp_path: Path, fake_node: type[_FakeNode],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSJMS_TELEMETRY_EXPORTER", "prometheus")
    assert cli.main(["serve", "--state-dir", str(tmp_path)]) == 0
    assert fake_node.events == ["lock", "telemetry prometheus 127.0.0.1:9464", "first recovery pass", "serving",
                                "stopped", "telemetry flushed"]


def test_serve_refused_its_state_directory_touches_no_metrics_port(tmp_path: Path, fake_node: type[_FakeNode],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSJMS_TELEMETRY_EXPORTER", "prometheus")
    fake_node.locked = True
    assert cli.main(["serve", "--state-dir", str(tmp_path)]) == 5
    assert fake_node.events == []


def test_serve_with_a_taken_metrics_address_exits_2_naming_the_key(
        tmp_path: Path, fake_node: type[_FakeNode], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NSJMS_TELEMETRY_EXPORTER", "prometheus")
    monkeypatch.setenv("NSJMS_TELEMETRY_ADDRESS", "127.0.0.1:1")
    assert cli.main(["serve", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "telemetry.address 127.0.0.1:1: cannot serve metrics there: Address already in use" in err
    assert fake_node.events == ["lock", "stopped after a failed start"]


def test_bridge_list_shows_a_bridge_whose_node_does_not_answer_and_lists_the_others() -> None:
    """The listing is the cluster's (get_all_bridges reads PostgreSQL): before, one bridge whose owner had died and
    was not taken over yet (TRANSIENT through the forward) made the whole ``bridge list`` exit 3, "node not
    reachable", although the node asked was up and every other bridge answered."""
    from types import SimpleNamespace

    from omniORB import CORBA

    from router.cli.bridge import _dispatch

    class BridgeNotFound(Exception):
        pass

    channel_ep = SimpleNamespace(connector=SimpleNamespace(_d=SimpleNamespace(_n="CHANNEL"), _v=7),
                                 type=SimpleNamespace(_n="STRUCTURED"), style=SimpleNamespace(_n="PUSH"))

    class Bridge:
        def __init__(self, answers: bool) -> None:
            self.answers = answers

        def _narrow(self, cls: object) -> Bridge:
            return self

        def get_status(self) -> str:
            if not self.answers:
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
            return "started"

        def _get_end_point_receiver(self) -> Any:
            return channel_ep

        def _get_end_point_sender(self) -> Any:
            return channel_ep

    bridges = {1: Bridge(True), 2: Bridge(False)}
    factory = SimpleNamespace(get_all_bridges=lambda: [1, 2], get_bridge_with_id=lambda bid: bridges[bid])
    lines: list[str] = []
    args = argparse.Namespace(bridge_command="list", json=False, existing_channels={7})
    code = _dispatch(args, factory, SimpleNamespace(BridgeNotFound=BridgeNotFound),
                     SimpleNamespace(started="started", ManagedBridge=object), lines.append,
                     {1: {"state": "active", "started": True, "reason": None}})
    assert code == 0, lines
    assert lines[0].startswith("bridge 1: channel:7") and lines[0].endswith("[active]"), lines
    assert lines[1].startswith("bridge 2: ? -> ?  [unreachable] its node does not answer now (TRANSIENT)"), lines
