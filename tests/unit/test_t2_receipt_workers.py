"""The worker threads that wait for a T2 broker branch's background receipts (router.bridge.txbranch._Workers)."""

from __future__ import annotations

import threading

from router.bridge.txbranch import _Background, _Workers


def test_every_job_runs_even_when_all_workers_are_busy() -> None:
    workers = _Workers()
    gate = threading.Event()
    done: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        assert gate.wait(10)
        with lock:
            done.append(i)

    finished = [threading.Event() for _ in range(6)]
    for i in range(6):
        workers.run(lambda i=i: (job(i), finished[i].set()))  # type: ignore[func-returns-value]
    gate.set()
    assert all(f.wait(10) for f in finished)
    assert sorted(done) == list(range(6))


def test_an_idle_worker_is_reused() -> None:
    workers = _Workers()
    names: list[str] = []
    for _ in range(3):
        ran = threading.Event()
        workers.run(lambda ran=ran: (names.append(threading.current_thread().name + str(threading.get_ident())),
                                     ran.set()))  # type: ignore[func-returns-value]
        assert ran.wait(10)
        # wait until the worker is back in the idle count before the next job (no sleep: poll the counter)
        for _ in range(10_000):
            with workers._lock:
                if workers._idle == 1:
                    break
            threading.Event().wait(0.001)
    assert len(set(names)) == 1, "one thread did all three jobs"


def test_background_reports_the_failure() -> None:
    def boom() -> None:
        raise RuntimeError("no receipt (injected)")

    assert isinstance(_Background(boom).wait(), RuntimeError)
    assert _Background(lambda: None).wait() is None
