"""A takeover's fence must not wait for a paused node's open transaction (docs/cluster.md, "Guarantees").

A node paused (SIGSTOP, a VM freeze) inside a unit of work after its fence check holds its own member row
``FOR KEY SHARE`` until PostgreSQL ends its session (``idle_in_transaction_session_timeout``: 60 s as the node sets
it): the survivor's fence, which reads that row ``FOR UPDATE``, waited that long (measured in
``test_cluster_faults.py``: claimed 60.5 s after the stop instead of about ``expiry_s`` + ``renew_s``).

While the fence waits, :class:`EndBlockers` ends (``pg_terminate_backend``) the sessions that block it **and** have
been idle inside a transaction for longer than ``idle_s``. Only the dead member's own units of work take its row
``FOR KEY SHARE`` (the fence check of :func:`router.cluster.members.check`; an operator's drain request does too, but
never idles), and a live node never stays idle inside a transaction for a renewal period; ending such a session
rolls its transaction back, which is what the fence would make of it anyway (the paused node can commit nothing
that depends on what it owned once fenced). Its PostgreSQL branches that are already prepared are not sessions and
are finished by the survivor's recovery.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

__all__ = ["EndBlockers"]

log = logging.getLogger("nsjms.cluster")

_SQL = ("SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_stat_activity a "
        "WHERE a.pid = ANY(pg_blocking_pids(%s)) "
        "AND a.state IN ('idle in transaction', 'idle in transaction (aborted)') "
        "AND a.state_change < clock_timestamp() - make_interval(secs => %s)")


class EndBlockers:
    """A context: while it is open, every ``poll_s`` seconds, end the sessions blocking backend ``pid`` (the fence's)
    that have been idle inside a transaction for more than ``idle_s`` seconds. ``db``: the node's
    :class:`router.db.Database` (each look is one short unit of work of its own); ``pid`` None: nothing is done."""

    def __init__(self, db: Any, pid: int | None, idle_s: float, what: str, poll_s: float = 0.25) -> None:
        self.db, self.pid, self.idle_s, self.what, self.poll_s = db, pid, idle_s, what, poll_s
        self.ended: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EndBlockers:
        if self.pid is not None:
            self._thread = threading.Thread(target=self._run, name="cluster-end-blockers", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                with self.db.unit_of_work() as conn:
                    rows = conn.execute(_SQL, (self.pid, self.idle_s)).fetchall()
            except Exception as exc:  # noqa: BLE001 - a look that failed is made again at the next poll
                log.debug("cluster: looking for sessions blocking the fence of %s failed: %s", self.what, exc)
                continue
            for pid, done in rows:
                if done:
                    self.ended.append(int(pid))
                    log.warning("cluster: ended PostgreSQL session %s, idle in a transaction for more than %g s, "
                                "that held the fence of %s (a paused node's unit of work)", pid, self.idle_s,
                                self.what)
