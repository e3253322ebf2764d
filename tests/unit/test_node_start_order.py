"""``Node.start`` order and undo, with in-memory twins of the embedded services (the real ones are exercised in
tests/integration/test_node_lifecycle.py): a start that cannot succeed touches no service; a failed start stops
only what it launched, never a leftover it adopted; the node never starts an anonymous broker; systemd's
``ExecStopPost`` decision (:func:`router.node.lifecycle.kept_for_restart`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import router.node.lifecycle as lifecycle
import router.node.services as services
from router.node.lifecycle import ServiceError, ServiceUnreachable, bind_problem, kept_for_restart
from router.node.server import Node, NodeSettings

EXTERNAL_DSN = "postgresql://u:secret@127.0.0.1:1/db"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.brokers: list[FakeMQ] = []


class FakeMQ:
    """Records how the node builds and drives its embedded broker; ``reused`` as the real one sets it."""

    recorder: Recorder
    leftover = False

    def __init__(self, base_dir: Any, stomp_port: int, openwire_port: int, **kw: Any) -> None:
        self.authenticate = kw.get("authenticate", False)  # the real class's default: anonymous
        self.reused = False
        self.login = self.passcode = ""
        self.pid: int | None = None
        self.recorder.brokers.append(self)

    def start(self) -> str:
        self.reused = self.leftover
        self.login, self.passcode = ("nsjms", "pw") if self.authenticate else ("", "")
        self.pid = 4242
        self.recorder.calls.append(f"broker {'adopted' if self.reused else 'started'} "
                                   f"authenticate={self.authenticate}")
        return "stomp://127.0.0.1:61613"

    def stop(self) -> None:
        self.recorder.calls.append("broker stopped")

    def alive(self) -> bool:
        return True


class FakePG:
    recorder: Recorder
    leftover = False

    def __init__(self, base_dir: Any, port: int, **kw: Any) -> None:
        self.reused = False
        self.pid: int | None = None

    def start(self) -> str:
        self.reused = self.leftover
        self.pid = 4343
        self.recorder.calls.append(f"postgres {'adopted' if self.reused else 'started'}")
        return "postgresql://postgres:pw@127.0.0.1:55432/nsjms"

    def stop(self) -> None:
        self.recorder.calls.append("postgres stopped")

    def alive(self) -> bool:
        return True


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder()
    mq = type("MQ", (FakeMQ,), {"recorder": recorder})
    pg = type("PG", (FakePG,), {"recorder": recorder})
    monkeypatch.setattr(services, "EmbeddedActiveMQ", mq)
    monkeypatch.setattr(services, "EmbeddedPostgres", pg)
    monkeypatch.setattr(lifecycle, "probe_broker", lambda *a: None)
    yield recorder


def settings(tmp_path: Path, **kw: Any) -> NodeSettings:
    with socket.socket() as sock:  # a free ORB port: the start checks it can listen there
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    return NodeSettings(state_dir=tmp_path / "state", orb_port=port, **kw)


def run_failing_start(node: Node, error: type[Exception]) -> None:
    """What ``cmd_serve`` does with a start that fails."""
    with pytest.raises(error):
        node.start()
    node.stop(start_failed=True)


def test_unreachable_external_dsn_ends_the_start_before_any_service_is_touched(
        tmp_path: Path, rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(dsn: str, timeout: float) -> str:
        rec.calls.append("pg probe")
        return "refused"

    monkeypatch.setattr(lifecycle, "probe_postgres", refused)
    FakeMQ.leftover = True
    try:
        run_failing_start(Node(settings(tmp_path, pg_dsn=EXTERNAL_DSN)), ServiceUnreachable)
    finally:
        FakeMQ.leftover = False
    assert rec.calls == ["pg probe"], "the leftover broker was neither adopted nor stopped"
    assert not (tmp_path / "state" / "node.lock").read_text(), "the lock was released"


def test_busy_orb_port_ends_the_start_before_any_service_is_touched(tmp_path: Path, rec: Recorder) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = int(busy.getsockname()[1])
        node = Node(NodeSettings(state_dir=tmp_path / "state", orb_port=port))
        with pytest.raises(ServiceError, match=rf"orb.host/orb.port: cannot listen on 127.0.0.1:{port}: "):
            node.start()
        node.stop(start_failed=True)
    assert rec.calls == []


def test_failed_start_keeps_adopted_services_and_stops_the_ones_it_launched(
        tmp_path: Path, rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_channel(self: Node) -> None:
        raise ServiceError("channel could not start")

    monkeypatch.setattr(Node, "_start_channel", broken_channel)
    monkeypatch.setattr(lifecycle, "probe_postgres", lambda dsn, t: None)
    FakeMQ.leftover = True  # a broker left by a killed node; PostgreSQL starts fresh
    try:
        run_failing_start(Node(settings(tmp_path)), ServiceError)
    finally:
        FakeMQ.leftover = False
    assert rec.calls == ["postgres started", "broker adopted authenticate=True", "postgres stopped"]


def test_embedded_postgres_that_does_not_answer_is_stopped_when_this_start_launched_it(
        tmp_path: Path, rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "probe_postgres", lambda dsn, t: "refused")
    run_failing_start(Node(settings(tmp_path)), ServiceUnreachable)
    assert rec.calls == ["postgres started", "broker started authenticate=True", "broker stopped", "postgres stopped"]


def test_a_deliberate_stop_stops_adopted_services_too(tmp_path: Path, rec: Recorder,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Node, "_start_channel", lambda self: None)
    monkeypatch.setattr(Node, "_publish", lambda self: None)
    monkeypatch.setattr(lifecycle, "probe_postgres", lambda dsn, t: None)
    FakeMQ.leftover = True
    try:
        node = Node(settings(tmp_path, watch_interval_s=3600))
        node.start()
        node.stop()
    finally:
        FakeMQ.leftover = False
    assert rec.calls == ["postgres started", "broker adopted authenticate=True", "broker stopped", "postgres stopped"]


@pytest.mark.parametrize("kw", [{}, {"pg_dsn": EXTERNAL_DSN}, {"broker_login": "x", "broker_passcode": "y"},
                                {"broker_url": "stomp://127.0.0.1:1"}])
def test_the_node_never_starts_an_anonymous_broker(tmp_path: Path, rec: Recorder, monkeypatch: pytest.MonkeyPatch,
                                                   kw: dict[str, Any]) -> None:
    """Whatever the configuration, every broker ``nsjms serve`` builds requires credentials (the class's default
    is anonymous, for test fixtures); with ``broker.url`` given none is built at all."""
    monkeypatch.setattr(Node, "_start_channel", lambda self: None)
    monkeypatch.setattr(Node, "_publish", lambda self: None)
    monkeypatch.setattr(lifecycle, "probe_postgres", lambda dsn, t: None)
    node = Node(settings(tmp_path, watch_interval_s=3600, **kw))
    node.start()
    node.stop()
    assert all(mq.authenticate is True for mq in rec.brokers), rec.calls
    assert len(rec.brokers) == (0 if "broker_url" in kw else 1)
    if rec.brokers:
        assert (node.broker_login, node.broker_passcode) == ("nsjms", "pw"), "the bridges log in with them"


def test_stop_services_builds_no_anonymous_broker_either(tmp_path: Path, rec: Recorder) -> None:
    from router.node.server import stop_services

    (tmp_path / "state").mkdir()
    assert stop_services(tmp_path / "state") == []
    assert [mq.authenticate for mq in rec.brokers] == [True]
    assert stop_services(tmp_path / "missing") == [] and not (tmp_path / "missing").exists()


def test_bind_problem() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = int(busy.getsockname()[1])
        assert "in use" in (bind_problem("127.0.0.1", port) or "")
    assert bind_problem("127.0.0.1", 0) is None
    assert bind_problem("192.0.2.1", 0) is not None  # not an address of this host


@pytest.mark.parametrize(("result", "code", "status", "kept"), [
    ("success", "exited", "0", False),        # systemctl stop: the node stopped its services itself
    ("timeout", "killed", "KILL", False),     # killed after TimeoutStopSec during a deliberate stop
    ("exit-code", "exited", "1", True),       # crashed: Restart=on-failure starts it again
    ("exit-code", "exited", "6", True),       # PostgreSQL down at start: retried
    ("signal", "killed", "KILL", True),
    ("core-dump", "dumped", "SEGV", True),
    ("oom-kill", "killed", "KILL", True),
    ("exit-code", "exited", "2", False),      # RestartPreventExitStatus: not restarted
    ("exit-code", "exited", "5", False),
    (None, None, None, False),                # run by hand
])
def test_kept_for_restart(result: str | None, code: str | None, status: str | None, kept: bool) -> None:
    assert kept_for_restart(result, code, status) is kept


def test_stop_services_command_reports_an_unreadable_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import router.node.server
    from router.cli import main

    def denied(state_dir: Path) -> list[str]:
        raise PermissionError(13, "Permission denied", str(state_dir / "node.lock"))

    monkeypatch.setattr(router.node.server, "stop_services", denied)
    for key in ("SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS"):
        monkeypatch.delenv(key, raising=False)
    assert main(["stop-services", "--state-dir", str(tmp_path)]) == 1
    assert "Permission denied" in capsys.readouterr().err
    monkeypatch.setenv("SERVICE_RESULT", "signal")  # a crash: nothing is touched, not even looked at
    assert main(["stop-services", "--state-dir", str(tmp_path), "--unless-restarting"]) == 0
    assert "keep running for it" in capsys.readouterr().out


def test_sigterm_handler_is_in_place_before_the_node_says_it_is_ready(
        tmp_path: Path, rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM right after endpoints.json appeared killed the process with the default action (exit -15):
    ``wait()`` installed the handlers only after ``_publish``."""
    import signal

    seen: list[Any] = []
    monkeypatch.setattr(lifecycle, "probe_postgres", lambda dsn, t: None)
    monkeypatch.setattr(Node, "_start_channel", lambda self: None)
    monkeypatch.setattr(Node, "_publish", lambda self: seen.append(signal.getsignal(signal.SIGTERM)))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    node = Node(settings(tmp_path))
    try:
        node.start()
        assert seen and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None), "no SIGTERM handler at publish time"
        seen[0](signal.SIGTERM, None)
        node.wait()  # returns: the signal asked the node to stop
    finally:
        node.stop()
        for sig, handler in before.items():
            signal.signal(sig, handler)
