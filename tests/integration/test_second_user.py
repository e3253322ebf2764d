"""A second local user (a real OS user this test creates, as an attacker would be) against a running node
(docs/security.md): she cannot read the state directory, the credentials or the recovery log; over IIOP with stubs
from the repository's IDL she cannot create a bridge or a channel, change a channel's admin properties, destroy a
channel, or list / commit / roll back / forget a transaction (NO_PERMISSION, COMPLETED_NO); her standard supplier and
consumer still move events. The node's own operator does the same operations through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import NsjmsServer, free_port
from stdclients import persistent_qos

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SYSTEM_PYTHON = "/usr/bin/python3.11"   # the venv's interpreter may live where others cannot reach it (/root)


@pytest.fixture
def second_user() -> Iterator[str]:
    assert os.geteuid() == 0, "this test creates an OS user: run it as root (CI and the dev machine do)"
    name = f"nsjms-probe-{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def probe_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """What she has: omniORBpy and stubs compiled from the repository's IDL, in a directory she can read."""
    kit = Path(f"/tmp/nsjms-probe-kit-{uuid.uuid4().hex[:8]}")
    kit.mkdir(mode=0o755)
    site = Path(__import__("omniORB").__file__).resolve().parent.parent
    for entry in site.iterdir():
        if entry.name.startswith(("omniORB", "_omni", "jeteve_omniorb")) and "dist-info" not in entry.name:
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, kit / entry.name)
    shutil.copytree(ROOT / "idl", kit / "idl", ignore=shutil.ignore_patterns("*.idl", "__pycache__"))
    shutil.copy2(HERE / "probes" / "second_user.py", kit / "second_user.py")
    subprocess.run(["chmod", "-R", "a+rX", str(kit)], check=True)
    try:
        yield kit
    finally:
        shutil.rmtree(kit, ignore_errors=True)


@pytest.fixture
def public_node(fresh_db: str, broker_url: str) -> Iterator[NsjmsServer]:
    """A node whose state directory sits in a directory everyone may traverse (/tmp), so only the node's own
    permissions stand between her and its files."""
    parent = Path(f"/tmp/nsjms-2nd-{uuid.uuid4().hex[:8]}")
    parent.mkdir(mode=0o755)
    state = parent / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=broker_url, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(parent, ignore_errors=True)


def cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_second_user_is_refused_admin_but_moves_events(public_node: NsjmsServer, second_user: str, probe_kit: Path,
                                                        client_orb: Any) -> None:
    state = public_node.state_dir
    factory = client_orb.factory(public_node.ior())
    _, cid = factory.create_channel(persistent_qos(), [])
    logs = sorted(str(p) for p in state.glob("xa-*.log"))
    assert logs, f"no recovery log in {state}"
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    run = subprocess.run([runuser, "-u", second_user, "--", SYSTEM_PYTHON, str(probe_kit / "second_user.py"),
                          str(public_node.port), str(cid), str(state), *logs],
                         capture_output=True, text=True, timeout=180, cwd="/tmp",
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(probe_kit)})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(seen["files"].values()) == {"denied"}, seen["files"]
    for op in ("create_bridge", "list_bridges", "create_channel", "set_admin", "destroy_channel", "txn_list",
               "txn_commit", "txn_rollback", "txn_commit_xid", "txn_forget"):
        assert seen[op] == "NO_PERMISSION", (op, seen[op])
    assert seen["received"] == [f"e{i}" for i in range(5)]
    assert cid in factory.get_all_channels()

    # the node's operator: the same operations through the CLI
    made = cli(state, "bridge", "create", "--from", f"channel:{cid}", "--to", "queue:payroll.private", "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    bid = json.loads(made.stdout)["id"]
    assert cli(state, "bridge", "stop", str(bid)).returncode == 0
    assert cli(state, "bridge", "destroy", str(bid)).returncode == 0
    listed = cli(state, "txn", "list", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert cli(state, "channel", "destroy", str(cid)).returncode == 0
    assert cid not in factory.get_all_channels()
