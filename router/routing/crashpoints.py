"""Named crash points, for the crash tests: the process kills itself (SIGKILL) when it reaches one.

Pause points (:func:`pausepoint`, for fault tests that act on the process from outside at a counted point, never
by timing): ``NSJMS_PAUSE_AT="in.local.before_commit@2/5/9"`` with ``NSJMS_PAUSE_DIR=DIR`` makes the 2nd, 5th and
9th passage write ``DIR/<point>.<passage>.reached`` and wait (at most 120 s) until the test creates
``DIR/<point>.<passage>.go``.

Crash points are off unless the environment variable ``NSJMS_CRASH_AT`` is set when the process starts; then it
names the points, comma-separated, each optionally with ``@N`` (die the N-th time that point is reached, default
1)::

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

__all__ = ["ENV", "PAUSE_DIR_ENV", "PAUSE_ENV", "PAUSE_POINTS", "POINTS", "armed", "crashpoint", "parse",
           "parse_pauses", "pausepoint", "pauses_armed"]

ENV = "NSJMS_CRASH_AT"

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


PAUSE_ENV, PAUSE_DIR_ENV = "NSJMS_PAUSE_AT", "NSJMS_PAUSE_DIR"
PAUSE_WAIT_S = 120.0

#: Every pause point and where it is.
PAUSE_POINTS: dict[str, str] = {
    "in.local.after_take": "JMS -> channel without T2: the round's inbox claims are made in its open transaction",
    "in.local.before_commit": "JMS -> channel without T2: the round's events are stored, its COMMIT not sent",
    "t2.in.before_phase_two": "JMS -> channel in T2: the decision is logged, phase two not begun",
    "t2.recovery.before_pg_commit": "recovery (or an operator) is about to commit a prepared PostgreSQL branch",
    "t2.recovery.before_pg_rollback": "recovery (or an operator) is about to roll back a prepared PostgreSQL branch",
}


def parse_pauses(text: str) -> dict[str, frozenset[int]]:
    """``"a@2/5,b@1"`` -> ``{"a": {2, 5}, "b": {1}}``; unknown names and counts < 1 are refused."""
    out: dict[str, frozenset[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, counts = part.partition("@")
        if name not in PAUSE_POINTS:
            raise ValueError(f"{PAUSE_ENV}: unknown pause point {name!r} (known: {', '.join(sorted(PAUSE_POINTS))})")
        passages = frozenset(int(c) for c in (counts or "1").split("/"))
        if min(passages) < 1:
            raise ValueError(f"{PAUSE_ENV}: {part!r}: passages are counted from 1")
        out[name] = passages
    return out


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


_pauses = parse_pauses(os.environ.get(PAUSE_ENV, ""))
_pause_dir = os.environ.get(PAUSE_DIR_ENV, "")
_passages: dict[str, int] = {}


def pauses_armed() -> bool:
    """Some pause point is armed (tests)."""
    return bool(_pauses)


def pausepoint(name: str) -> None:
    """Wait for the test at an armed passage of ``name`` (see the module docstring); else nothing."""
    if not _pauses or name not in _pauses:
        return
    with _lock:
        _passages[name] = passage = _passages.get(name, 0) + 1
    if passage not in _pauses[name]:
        return
    from pathlib import Path

    base = Path(_pause_dir or ".") / f"{name}.{passage}"
    Path(f"{base}.reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_WAIT_S
    while not Path(f"{base}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
