"""A node's membership: join at start, renew the lease in the background, leave at a clean stop.

The node id is its identity in the cluster tables; the epoch of this incarnation is kept in the state directory
(``member.json``, private) so a restart can tell its own previous incarnation (dead: this process holds the state
directory's lock, which that one held) from another process using the same node id elsewhere (refused with
:class:`~router.cluster.errors.NodeLive`, exit 5: two processes with one node id would act on the same work).

A renewal that finds the node fenced calls ``on_fenced`` once: the node must stop acting on what it owned (its
writes that check the epoch are refused anyway) and start again as a new member. A renewal that cannot reach
PostgreSQL is retried at the next period; the lease then runs out after ``expiry_s`` like any other.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router import telemetry
from router.cluster import members as M
from router.cluster.errors import Fenced, NodeLive
from router.cluster.lease import LeaseSettings

__all__ = ["Membership"]

log = logging.getLogger("nsjms.cluster")

MEMBER_FILE = "member.json"


class Membership:
    """This node's membership row and its renewal thread. ``db`` is the node's :class:`router.db.Database`."""

    def __init__(self, db: Any, node_id: str, address: str, state_dir: Path, settings: LeaseSettings,
                 on_fenced: Callable[[], None], *, write_private: Callable[[Path, str], None],
                 token: str | None = None) -> None:
        self.db, self.node_id, self.address = db, node_id, address
        self.path = state_dir / MEMBER_FILE
        self.settings = settings
        self.on_fenced = on_fenced
        self.token = token              # this process's incarnation token (its sessions are named after it)
        self._write_private = write_private
        self.epoch: int | None = None
        self.fenced = False
        self._fenced_lock = threading.Lock()
        self._leave_conn: Any = None     # the connection of stop()'s leave: the fence check lets that one through
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._members: list[dict[str, Any]] = []

    def _recorded(self) -> tuple[int, str] | None:
        try:
            data = json.loads(self.path.read_text())
            return int(data["epoch"]), str(data["incarnation"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def join(self) -> int:
        """Join (see the module docstring); :class:`NodeLive` when another process holds this node id.

        The previous incarnation is this state directory's only when the row's epoch AND its random incarnation
        token are the ones ``member.json`` recorded: a copy of the state directory (a restored backup, a cloned VM
        or container) carries the same epoch but cannot steal a live node's id unless it also carries the token of
        the very incarnation that row names; even then, only the process holding that copy's lock runs."""
        mine = self._recorded()
        token = self.token or secrets.token_hex(16)     # the token naming this process's sessions, if given
        steal = mine is not None and self._still_ours(mine)
        with self.db.unit_of_work() as conn:
            if steal and M.incarnation(conn, self.node_id) != mine:
                steal = False                                  # someone joined meanwhile
            try:
                epoch = M.join(conn, self.node_id, self.address, self.settings, steal=steal, token=token)
            except NodeLive as exc:
                raise NodeLive(f"{exc}; this state directory's last incarnation was epoch "
                               f"{mine[0] if mine else None}; if that other "
                               f"node is gone, start again after its lease expires ({self.settings.expiry_s:g} s)",
                               self.node_id) from None
        self._write_private(self.path, json.dumps({"node_id": self.node_id, "epoch": epoch, "incarnation": token})
                            + "\n")
        self.epoch = epoch
        log.info("cluster: node %s joined as epoch %d (%s)", self.node_id, epoch, self.address)
        return epoch

    def _still_ours(self, mine: tuple[int, str]) -> bool:
        """Whether the row names this state directory's last incarnation and nobody renews it: a live lease whose
        ``renewed_at`` moves within two renewal periods is renewed by a running process (an exact copy of this
        state directory elsewhere: a cloned VM or container), which a restart must not fence."""
        def row() -> Any:
            with self.db.unit_of_work() as conn:
                if M.incarnation(conn, self.node_id) != mine:
                    return None
                return {m.node_id: m for m in M.members(conn)}.get(self.node_id)

        first = row()
        if first is None:
            return False
        if not first.live:
            return True
        self._stop.wait(2 * self.settings.renew_s + 0.5)
        again = row()
        return again is not None and again.renewed_at == first.renewed_at

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cluster-lease", daemon=True)
        self._thread.start()

    def notice_fenced(self, exc: Exception) -> None:
        """This node learnt it was fenced (a renewal, or a write's fence check refused): ``on_fenced``, once."""
        with self._fenced_lock:
            if self.fenced:
                return
            self.fenced = True
        self.last_error = str(exc)
        log.critical("cluster: %s; this node stops acting and must start again as a new member", exc)
        self.on_fenced()

    def renew_once(self) -> bool:
        """One renewal; False once fenced (``on_fenced`` was called)."""
        assert self.epoch is not None
        if self.fenced:
            return False
        try:
            began = time.monotonic()
            with self.db.unit_of_work() as conn:
                M.renew(conn, self.node_id, self.epoch, self.settings)
                self._members = [{"node_id": m.node_id, "epoch": m.epoch, "state": m.state, "address": m.address,
                                  "lease_left_s": round(m.lease_left_s, 1)} for m in M.members(conn)]
            telemetry.cluster_lease_renewed(time.monotonic() - began)
            self.last_error = None
            return True
        except Fenced as exc:
            self.notice_fenced(exc)
            return False
        except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: retried next period, the lease says the rest
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("cluster: lease renewal failed (%s); retrying in %g s", self.last_error,
                        self.settings.renew_s)
            return True

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.renew_s):
            if not self.renew_once():
                return

    def stop(self) -> None:
        """Stop renewing and leave (a survivor may claim this node's work at once); best effort."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.renew_s + 10)
        if self.epoch is None or self.fenced:
            return
        try:
            with self.db.unit_of_work() as conn:
                M.leave(conn, self.node_id, self.epoch)
                self._leave_conn = conn
        except Exception:
            log.warning("cluster: leaving failed; the lease expires by itself", exc_info=True)
        finally:
            self._leave_conn = None

    def is_leave(self, conn: Any) -> bool:
        """Whether ``conn`` is running this node's leave (its last write, made after its state is no longer
        checked live): the node's fence check lets that unit of work through, and only that one (consumed)."""
        if conn is None or conn is not self._leave_conn:
            return False
        self._leave_conn = None
        return True

    def status(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "epoch": self.epoch, "fenced": self.fenced, "error": self.last_error,
                "lease_renew_s": self.settings.renew_s, "lease_expiry_s": self.settings.expiry_s,
                "members": list(self._members)}
