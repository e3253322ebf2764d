"""Restarting the embedded PostgreSQL right after its postmaster was SIGKILLed (the node's supervision does this):
the dead postmaster stays in the process table for a moment — exiting, its command line already gone, then a
zombie — and PostgreSQL refuses to start while the pid of its lock file exists ("lock file postmaster.pid
already exists"). ``_wait_stale_postmaster_gone`` waits until that pid is gone, not only while it is a zombie
(the README test run saw the exiting state: the restart failed). The process table is simulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.node import services
from router.node.lifecycle import ServiceError
from router.node.services import postgres


class Table:
    """One pid's states, one per poll: "running" (our postmaster), "exiting", "zombie", then gone."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.polls = 0

    def state(self) -> str | None:
        return self.states[min(self.polls, len(self.states) - 1)] if self.states else None

    def tick(self, _seconds: float) -> None:
        self.polls += 1


def _server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: Table) -> services.EmbeddedPostgres:
    server = services.EmbeddedPostgres(tmp_path, 5432)
    server.data.mkdir(parents=True)
    (server.data / "postmaster.pid").write_text("4242\n/data\n0\n5432\n")
    monkeypatch.setattr(postgres, "pid_exists", lambda pid: table.state() not in (None, "gone"), raising=False)
    monkeypatch.setattr(postgres, "is_zombie", lambda pid: table.state() == "zombie")
    monkeypatch.setattr(server, "_is_postmaster", lambda pid: table.state() == "running")
    monkeypatch.setattr("router.node.services.postgres.time.sleep", table.tick)
    return server


def test_an_exiting_postmaster_is_waited_for_until_its_pid_is_gone(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table(["exiting", "exiting", "zombie", "zombie", "gone"])
    _server(tmp_path, monkeypatch, table)._wait_stale_postmaster_gone()
    assert table.polls == 4, "returned while the dead postmaster's pid still existed"


@pytest.mark.parametrize(("state", "reason"), [("exiting", "not this cluster's postmaster"),
                                               ("zombie", "not reaped yet")])
def test_a_pid_that_never_goes_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str,
                                          reason: str) -> None:
    table = Table([state])
    clock = iter(range(0, 10_000, 1))
    monkeypatch.setattr("router.node.services.postgres.time.monotonic", lambda: float(next(clock)))
    with pytest.raises(ServiceError, match=reason):
        _server(tmp_path, monkeypatch, table)._wait_stale_postmaster_gone()


def test_a_running_postmaster_is_not_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table(["running"])
    _server(tmp_path, monkeypatch, table)._wait_stale_postmaster_gone()
    assert table.polls == 0
