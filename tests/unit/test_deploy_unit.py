"""deploy/nsjms.service: the commands it runs exist in the CLI, crash restarts keep the embedded services (what
``stop-services --unless-restarting`` decides matches the unit's restart rules), and ``systemd-analyze verify``
accepts it. The commands themselves run against real services in tests/integration/test_node_lifecycle.py."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from router.cli import build_parser
from router.node.lifecycle import NOT_RESTARTED_STATUSES, kept_for_restart

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "nsjms.service"


def directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_runs_commands_the_cli_has() -> None:
    units = directives()
    for key in ("ExecStart", "ExecStopPost"):
        (line,) = units[key]
        argv = shlex.split(line.lstrip("-"))
        assert argv[0] == "/opt/nsjms/bin/nsjms"
        build_parser().parse_args(argv[1:])  # exits (SystemExit) on an unknown command or option
    assert shlex.split(units["ExecStopPost"][0])[1:3] == ["stop-services", "--config"]
    assert "--unless-restarting" in units["ExecStopPost"][0]


def test_a_crash_leaves_the_embedded_services_to_the_restarted_node() -> None:
    units = directives()
    assert units["KillMode"] == ["process"], "mixed/control-group would SIGKILL the services after a crash"
    assert units["Restart"] == ["on-failure"]
    assert set(units["RestartPreventExitStatus"][0].split()) == NOT_RESTARTED_STATUSES
    assert kept_for_restart("signal", "killed", "SEGV") and not kept_for_restart("success", "exited", "0")


def test_stop_timeout_covers_a_clean_stop_and_restarts_never_give_up() -> None:
    """A clean stop takes at most: channel threads 5 s + T2 housekeeping join 10 s + the embedded broker's
    SIGTERM-to-SIGKILL 30 s + PostgreSQL's fast shutdown (a few s); systemd must not SIGKILL the node before."""
    import inspect

    from router.node.services import EmbeddedActiveMQ

    broker_stop = inspect.signature(EmbeddedActiveMQ.__init__).parameters["stop_timeout"].default
    units = directives()
    assert int(units["TimeoutStopSec"][0]) >= 5 + 10 + broker_stop + 15
    assert units["StartLimitIntervalSec"] == ["0"], "recovery at start heals; the unit must keep restarting"
    assert int(units["RestartSec"][0]) >= 1


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed: scripts/bootstrap.sh installs it (apt-get install systemd)",
                    pytrace=False)
    # verify checks that the executables exist: /opt/nsjms is not installed here, so point them at /bin/true
    unit = tmp_path / "nsjms.service"
    unit.write_text(UNIT.read_text().replace("/opt/nsjms/bin/nsjms", "/bin/true"))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and "nsjms.service" not in done.stderr, done.stdout + done.stderr


def test_the_embedded_brokers_stomp_connector_sends_frames_at_once(tmp_path: Path) -> None:
    """The broker the node embeds (and the test image renders from the same template) turns Nagle's algorithm off
    on its STOMP connector: a RECEIPT otherwise waits for the node's delayed ACK (docs/external-services.md)."""
    import xml.etree.ElementTree as ET

    from router.node.services import EmbeddedActiveMQ

    broker = EmbeddedActiveMQ(tmp_path, 61613, 61616)
    root = ET.fromstring(broker._instance_xml())
    uris = {c.get("name"): c.get("uri", "") for c in root.iter("{http://activemq.apache.org/schema/core}"
                                                                 "transportConnector")}
    assert "transport.tcpNoDelay=true" in uris["stomp"].split("?", 1)[1].split("&")
