"""Named crash points, for the crash tests: the process kills itself (SIGKILL) when it reaches one.

Off unless the environment variable ``NSJMS_CRASH_AT`` is set when the process starts; then it names the points,
comma-separated, each optionally with ``@N`` (die the N-th time that point is reached, default 1)::

    NSJMS_CRASH_AT="t2.out.after_decision@3"

:func:`crashpoint` costs one dictionary test when no point is armed. The points in use are listed in
:data:`POINTS` (a test checks that every name passed to :func:`crashpoint` is listed and documented in
docs/transactions.md). Nothing in production configuration can arm them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

__all__ = ["ENV", "PAUSE_DIR_ENV", "PAUSE_ENV", "POINTS", "armed", "crashpoint", "parse", "pausepoint"]

ENV = "NSJMS_CRASH_AT"
#: Pause instead of dying (a test injects a fault of another process at the point, e.g. stops PostgreSQL):
#: ``NSJMS_PAUSE_AT="name@N"`` with ``NSJMS_PAUSE_DIR``; see :func:`pausepoint`.
PAUSE_ENV = "NSJMS_PAUSE_AT"
PAUSE_DIR_ENV = "NSJMS_PAUSE_DIR"
#: A paused point goes on by itself after this long (a test that died must not leave the node stuck for ever).
PAUSE_LIMIT_S = 300.0

#: Every crash point of the code base and where it is (docs/transactions.md repeats this list).
POINTS: dict[str, str] = {
    "t2.before_prepare": "a T2 is about to run phase one (nothing prepared)",
    "t2.after_prepare": "every branch of a T2 is prepared, the decision is not written",
    "t2.after_decision": "the COMMIT record of a T2 is durable, no branch committed",
    "t2.after_pg_commit": "the PostgreSQL branch of a T2 committed, the broker branch not yet",
    "t2.after_broker_commit": "the broker branch of a T2 committed, the END record not written",
    "in.local.after_commit": "JMS -> channel without T2: the local transaction (events + inbox) committed, the "
                             "acks not written",
    "t2.in.before_phase_two": "a JMS -> channel T2 is decided (its COMMIT record durable), its phase two (COMMIT "
                              "PREPARED, the broker's COMMIT of the acks) not begun",
    "t2.recovery.after_pg_commit": "recovery committed a prepared branch, the re-send not done",
    "t2.recovery.after_resend": "recovery re-sent outbox rows, the END record not written",
}


def parse(text: str) -> dict[str, int]:
    """``"a@2,b"`` -> ``{"a": 2, "b": 1}``; unknown names are refused (a typo must not make a test pass)."""
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("@")
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown crash point {name!r} (known: {', '.join(sorted(POINTS))})")
        armed[name] = int(count) if count else 1
        if armed[name] < 1:
            raise ValueError(f"{ENV}: {part!r}: the count must be >= 1")
    return armed


_armed = parse(os.environ.get(ENV, ""))
_paused = parse(os.environ.get(PAUSE_ENV, "")) if os.environ.get(PAUSE_DIR_ENV) else {}
_lock = threading.Lock()


def armed() -> dict[str, int]:
    return dict(_armed)


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and this is its N-th passage."""
    if not _armed or name not in _armed:
        return
    with _lock:
        _armed[name] -= 1
        if _armed[name] > 0:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def pausepoint(name: str) -> None:
    """Pause this thread at the N-th passage of ``name`` when it is armed in ``NSJMS_PAUSE_AT``: create
    ``<NSJMS_PAUSE_DIR>/<name>.paused`` and wait until the test removes it (at most :data:`PAUSE_LIMIT_S`)."""
    if not _paused or name not in _paused:
        return
    with _lock:
        _paused[name] -= 1
        if _paused[name] != 0:
            return
    marker = os.path.join(os.environ[PAUSE_DIR_ENV], f"{name}.paused")
    with open(marker, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
