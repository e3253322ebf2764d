"""The node's state directory: its exclusive lock, who may traverse it (the embedded services' OS users when run
as root), and ``nsjms stop-services`` (the embedded services of a state directory no node runs on).

Part of the node's composition root (:mod:`router.node.server` starts with :func:`lock_state_dir`); nothing here
runs at import.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["broker_may_traverse", "lock_state_dir", "postgres_may_traverse", "stop_services"]


def lock_state_dir(state_dir: Path) -> Any:
    """Creates and locks the state directory; an unusable one (read-only, a file, under /proc, another user's) is
    :class:`router.node.lifecycle.StateDirUnusable` naming the OS's reason, never a raw errno."""
    from router.node.lifecycle import StateDirUnusable, StateLock

    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = StateLock(state_dir)
        lock.acquire()
    except OSError as exc:  # StateDirLocked is not an OSError: it passes through
        what = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(state_dir) else ""
        raise StateDirUnusable(state_dir, f"{what}{where}") from exc
    return lock


def _group_may_traverse(state_dir: Path, group: str) -> None:
    """``root:<group> 0710`` on the state directory; nothing when the OS has no such group's user."""
    try:
        shutil.chown(state_dir, group=group)
        os.chmod(state_dir, 0o710)
    except LookupError:
        pass


def postgres_may_traverse(state_dir: Path) -> None:
    """As root: ``root:postgres 0710`` on the state directory, so the ``postgres`` OS user reaches ``pg/``."""
    from router.node.services import PG_OS_USER

    if os.geteuid() == 0:
        _group_may_traverse(state_dir, PG_OS_USER)   # no postgres user: EmbeddedPostgres says what to install


def broker_may_traverse(state_dir: Path) -> None:
    """As root: a state directory no group may traverse yet gets ``root:activemq 0710`` (the embedded broker runs
    as ``activemq``); one that ``postgres`` traverses stays so (the broker holds that group, see EmbeddedActiveMQ)."""
    from router.node.services import BROKER_OS_USER

    if os.geteuid() == 0 and os.stat(state_dir).st_gid == 0:
        _group_may_traverse(state_dir, BROKER_OS_USER)   # no activemq user: EmbeddedActiveMQ says what to install


def stop_services(state_dir: Path) -> list[str]:
    """Stop the embedded PostgreSQL and ActiveMQ left running under ``state_dir`` by a node that is gone.

    Takes the state directory's lock first (:class:`router.node.lifecycle.StateDirLocked` while a node runs there:
    nothing is touched), removes the stale ``endpoints.json``/``status.json`` and returns what it stopped.
    """
    from router.node import services
    from router.node.lifecycle import StateLock

    if not state_dir.is_dir():
        return []  # never a node here (and the directory is not created)
    lock = StateLock(state_dir)
    lock.acquire()
    try:
        stopped = []
        mq = services.EmbeddedActiveMQ(state_dir, 0, 0, authenticate=True)  # ports are not needed to stop it
        pid = mq.pid
        if pid is not None:
            mq.stop()
            stopped.append(f"embedded ActiveMQ (pid {pid})")
        pg = services.EmbeddedPostgres(state_dir, 0)
        pid = pg.pid
        if pid is not None:
            postgres_may_traverse(state_dir)  # pg_ctl runs as postgres
            pg.stop()
            stopped.append(f"embedded PostgreSQL (pid {pid})")
        for name in ("endpoints.json", "status.json"):
            (state_dir / name).unlink(missing_ok=True)
        return stopped
    finally:
        lock.release()
