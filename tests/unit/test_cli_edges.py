"""Issue 29's rough edges of the command line: exit codes, ``--json`` errors, a closed pipe, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from router import cli

REPO = Path(__file__).resolve().parents[2]


def nsjms(*argv: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", *argv], capture_output=True, text=True, check=False,
                          timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("where", ["a file", "under /proc"])
def test_an_unusable_state_directory_is_exit_2_naming_the_key(tmp_path: Path, where: str) -> None:
    """It was a raw errno and exit 1, which the systemd unit retried every 5 s forever."""
    if where == "a file":
        state = tmp_path / "state"
        state.write_text("not a directory")
    else:
        state = Path("/proc/nsjms-state")
    done = nsjms("serve", "--state-dir", str(state), "--orb-port", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"nsjms serve: node.state_dir / --state-dir: state directory {state} cannot be used: " in done.stderr
    assert "from --state-dir" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`nsjms bridge list --json | head -1` printed a BrokenPipeError traceback."""
    script = ("import argparse, sys\n"
              "from router.cli.out import run_handler\n"
              "def handler(args, cfg):\n"
              "    for i in range(200000):\n"
              "        print(f'line {i}')\n"
              "    return 0\n"
              "sys.exit(run_handler(handler, argparse.Namespace(command='status', json=False), None))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # the reader goes away, as `head -1` does
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert err == "", err


def test_json_failure_is_a_json_error_object_on_stdout(tmp_path: Path) -> None:
    done = nsjms("--json", "status", "--state-dir", str(tmp_path / "none"))
    assert done.returncode == 3
    error = json.loads(done.stdout)["error"]
    assert error["command"] == "status" and error["exit_code"] == 3 and "no running node" in error["message"]
    assert "no running node" in done.stderr  # humans still read it on stderr


@pytest.mark.parametrize("argv", [["demo", "--rate", "0"], ["demo", "--rate", "-1"], ["demo", "--count", "-1"],
                                  ["demo", "--rate", "nan"], ["serve", "--demo-rate", "0"],
                                  ["serve", "--demo-count", "-2"]])
def test_demo_rate_and_count_out_of_range_are_usage_errors(argv: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --rate 0` crashed (ZeroDivisionError); `--count -1` and `--rate -1` were accepted."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_demo_json_prints_only_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --json` printed its human lines before the JSON."""
    import router.cli.demo

    (tmp_path / "endpoints.json").write_text("{}")

    def fake_run_demo(state_dir: Path, **kw: Any) -> router.cli.demo.DemoResult:
        kw["out"]("demo: channel 1 created")
        if kw["progress"] is not None:
            kw["progress"]("demo: <- received 1")
        return router.cli.demo.DemoResult(run="r", queue="q", pushed=1, received=1)

    monkeypatch.setattr(router.cli.demo, "run_demo", fake_run_demo)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setattr("signal.signal", lambda *a: None)
    assert cli.main(["demo", "--count", "1", "--json", "--state-dir", str(tmp_path)]) == cli.EXIT_OK
    out, err = capsys.readouterr()
    assert json.loads(out)["received"] == 1
    assert "demo: channel 1 created" in err


def test_stop_services_refused_by_a_running_node_says_nothing_was_stopped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "refusing to start", the start's wording."""
    from router.node.lifecycle import StateLock

    lock = StateLock(tmp_path)
    lock.acquire()
    try:
        assert cli.main(["stop-services", "--state-dir", str(tmp_path)]) == cli.EXIT_LOCKED
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert "is in use by a running nsjms node (pid " in err and "nothing was stopped" in err, err
    assert "refusing to start" not in err


def test_a_refused_postgres_password_says_what_is_wrong() -> None:
    """Compose with new secrets over old volumes looped on a bare "password authentication failed"."""
    from router.node.lifecycle import postgres_hint

    why = postgres_hint('connection failed: FATAL: password authentication failed for user "postgres"')
    assert "the password does not match the one the server has" in why and "volume" in why
    assert postgres_hint("connection refused") == "connection refused"


def test_json_output_is_not_held_while_txn_asks_on_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from router.cli.out import run_handler

    def asks(args: argparse.Namespace, cfg: Any) -> int:
        print("type yes to commit g: ", end="")
        assert capsys.readouterr().out == "type yes to commit g: ", "the prompt reached the terminal at once"
        return 0

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    assert run_handler(asks, argparse.Namespace(command="txn", json=True, yes=False), None) == 0


@pytest.mark.parametrize("exception", ["TIMEOUT", "TRANSIENT", "COMM_FAILURE"])
def test_a_node_that_does_not_answer_is_exit_3_for_txn_too(exception: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`nsjms txn list` against a SIGSTOPped node printed a CORBA.TIMEOUT traceback and exited 1."""
    from omniORB import CORBA

    import router.cli.txn

    def hung(args: Any, cfg: Any) -> int:
        raise getattr(CORBA, exception)(0, CORBA.COMPLETED_NO)

    monkeypatch.setattr(router.cli.txn, "run", hung)
    assert cli.main(["txn", "list", "--state-dir", str(tmp_path)]) == cli.EXIT_NOT_RUNNING
    err = capsys.readouterr().err
    assert f"nsjms txn: node not reachable: {exception}" in err and "Traceback" not in err
