"""router.node.lifecycle without services: the state-directory lock, backoff, the watch loop, private files."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from router.node.lifecycle import (
    EMBEDDED_RESTART,
    Health,
    RestartPolicy,
    ServiceUnreachable,
    ServiceWatch,
    StateDirLocked,
    StateLock,
    private_tree,
    restart_delay,
    write_private,
)


def test_second_lock_on_the_same_state_dir_is_refused_at_once(tmp_path: Path) -> None:
    first = StateLock(tmp_path)
    first.acquire()
    try:
        assert (tmp_path / "node.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(StateDirLocked) as info:
            StateLock(tmp_path).acquire()
        assert info.value.pid == os.getpid() and info.value.path == tmp_path
        assert f"is in use by a running nsjms node (pid {os.getpid()}" in str(info.value)
        assert pickle.loads(pickle.dumps(info.value)).pid == os.getpid()
    finally:
        first.release()
    again = StateLock(tmp_path)
    again.acquire()  # released: the next node gets it
    again.release()


def test_the_lock_dies_with_its_process_and_is_not_inherited(tmp_path: Path) -> None:
    code = (
        "import sys, subprocess; from pathlib import Path; from router.node.lifecycle import StateLock\n"
        "lock = StateLock(Path(sys.argv[1])); lock.acquire()\n"
        # a service outliving its node must not keep the lock
        "child = subprocess.Popen(['sleep', '30'], stdout=subprocess.DEVNULL)\n"
        "print(child.pid, flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        with pytest.raises(StateDirLocked):
            StateLock(tmp_path).acquire()
        proc.kill()
        proc.communicate(timeout=10)
        lock = StateLock(tmp_path)
        lock.acquire()  # the holder died (its child still runs): the lock is free
        lock.release()
    finally:
        os.kill(child, 9)  # not our child (the killed holder's): init reaps it


def test_restart_delay_is_bounded_exponential() -> None:
    policy = RestartPolicy(initial_s=1, max_s=30)
    assert [restart_delay(n, policy) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]


class FakeService:
    def __init__(self, fail_starts: int = 0) -> None:
        self.running = True
        self.starts = 0
        self.fail_starts = fail_starts
        self.pid: int | None = 100

    def alive(self) -> bool:
        return self.running

    def start(self) -> str:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeError("port busy\nmore detail")
        self.running, self.pid = True, 100 + self.starts
        return "url"


def test_watch_restarts_a_dead_service_and_records_it() -> None:
    now = [0.0]
    health = Health("broker.url", "stomp://127.0.0.1:1", True)
    service = FakeService(fail_starts=1)
    policy = RestartPolicy(initial_s=0, max_s=0, stable_after_s=60)
    watch = ServiceWatch("ActiveMQ", health, lambda: None, service, policy=policy, clock=lambda: now[0])
    watch.check_once()
    assert (service.starts, health.restarts, health.reachable) == (0, 0, True)
    service.running = False
    watch.check_once()                          # first restart fails: recorded, retried at the next check
    assert (service.starts, health.restarts) == (1, 0)
    assert health.last_restart_error == "port busy"
    watch.check_once()
    assert (service.starts, health.restarts, health.pid, health.last_restart_error) == (2, 1, 102, "")
    assert health.last_restart is not None
    assert health.as_dict()["restarts"] == 1


def test_watch_backoff_grows_and_resets_after_a_stable_period() -> None:
    now = [0.0]
    waits: list[float] = []
    health = Health("postgres.dsn", "postgresql://u:***@h/db", True)
    service = FakeService()
    watch = ServiceWatch("PostgreSQL", health, lambda: None, service,
                         policy=RestartPolicy(initial_s=1, max_s=4, stable_after_s=60), clock=lambda: now[0])
    real_wait = watch._stop.wait

    def record(delay: float | None = None) -> bool:
        waits.append(0.0 if delay is None else delay)
        return real_wait(0)

    watch._stop.wait = record  # type: ignore[method-assign,assignment]
    for _ in range(5):
        service.running = False
        watch.check_once()
    assert waits == [0, 1, 2, 4, 4]
    now[0] += 61
    watch.check_once()                          # alive for longer than stable_after_s
    service.running = False
    watch.check_once()
    assert waits[-1] == 0


def test_watch_records_reachability_changes() -> None:
    answers = iter(["cannot connect to 127.0.0.1:1: Connection refused", None])
    health = Health("broker.url", "stomp://127.0.0.1:1", False)
    watch = ServiceWatch("broker", health, lambda: next(answers))
    watch.check_once()
    assert (health.reachable, health.error) == (False, "cannot connect to 127.0.0.1:1: Connection refused")
    watch.check_once()
    assert (health.reachable, health.error) == (True, "")


def test_watch_thread_stops() -> None:
    seen = threading.Event()

    def probe() -> None:
        seen.set()

    watch = ServiceWatch("x", Health("k", "a", False), probe, interval=0.01)
    watch.start()
    assert seen.wait(10)
    watch.stop()
    assert watch._thread is not None and not watch._thread.is_alive()


def test_private_files(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        (tmp_path / "d" / "e").mkdir(parents=True)
        (tmp_path / "d" / "f").write_text("x")
    finally:
        os.umask(old)
    (tmp_path / "d" / "link").symlink_to("/etc/hostname")
    private_tree(tmp_path)
    for path in [tmp_path, tmp_path / "d", tmp_path / "d" / "e", tmp_path / "d" / "f"]:
        assert path.stat().st_mode & 0o077 == 0, path
    assert Path("/etc/hostname").stat().st_mode & 0o004, "a symlink's target is left alone"
    write_private(tmp_path / "secret", "s3cret\n")
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secret").read_text() == "s3cret\n"


def test_service_unreachable_names_key_and_address() -> None:
    exc = ServiceUnreachable("postgres.dsn", "postgresql://u:***@127.0.0.1:1/db", "connection refused")
    assert str(exc) == "postgres.dsn: cannot reach postgresql://u:***@127.0.0.1:1/db: connection refused"
    assert pickle.loads(pickle.dumps(exc)).key == "postgres.dsn"


def test_status_on_private_files_of_another_user_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import router.node.status
    from router.cli import EXIT_FAILURE, main

    def private(state_dir: Path) -> dict[str, object]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(router.node.status, "collect", private)
    assert main(["status", "--state-dir", str(tmp_path)]) == EXIT_FAILURE
    assert "run as the node's user" in capsys.readouterr().err


def test_embedded_restart_delay_is_jittered_and_never_grows_past_a_few_seconds() -> None:
    """Issue 31: after a disk-full broker death the restarts kept failing for 64 s after space was freed (the
    delay had doubled to 30 s). The embedded services' policy stays within 4 s, jittered into [d/2, d]."""
    policy = EMBEDDED_RESTART
    for n in range(1, 50):
        top = restart_delay(n, policy, 1.0)
        assert 0 < top <= 4.0
        assert restart_delay(n, policy, 0.0) == pytest.approx(top / 2)
        assert restart_delay(n, policy, 0.0) <= restart_delay(n, policy, 0.37) <= top
    assert restart_delay(0, policy, 0.5) == 0.0                       # the first restart goes at once


def test_a_service_whose_cause_is_gone_restarts_within_the_bounded_delay() -> None:
    """A broker that cannot start while its disk is full fails restart after restart; once the cause is gone the
    next attempt comes after at most 4 s, however long the outage lasted."""
    now = [0.0]
    waits: list[float] = []
    health = Health("broker.url", "stomp://127.0.0.1:1", True)
    service = FakeService(fail_starts=40)                              # 40 failed starts: the disk stays full
    draws = iter([0.0, 1.0] * 100)
    watch = ServiceWatch("ActiveMQ", health, lambda: None, service, clock=lambda: now[0], draw=lambda: next(draws))
    real_wait = watch._stop.wait

    def record(delay: float | None = None) -> bool:
        waits.append(0.0 if delay is None else delay)
        now[0] += 0.0 if delay is None else delay
        return real_wait(0)

    watch._stop.wait = record  # type: ignore[method-assign,assignment]
    service.running = False
    while service.fail_starts:
        watch.check_once()
    assert health.restarts == 0 and service.starts == 40
    watch.check_once()                                                 # the cause is gone: this one succeeds
    assert health.restarts == 1 and service.running
    assert max(waits) <= 4.0 and min(waits[4:]) >= 2.0, waits          # bounded, jittered in [2, 4] once grown
    assert len(set(waits[4:])) > 1, "jittered"
