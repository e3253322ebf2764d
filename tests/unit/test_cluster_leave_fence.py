"""The node's fence check lets only the leave's own unit of work through while the node leaves (router/node/server.py
Node._fence_check, router/cluster/node.py Membership.stop), with fakes: every other unit of work of the node that
ends meanwhile is still checked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from router.cluster import members as M
from router.cluster.lease import LeaseSettings
from router.cluster.node import Membership
from router.node.server import Node


class _Db:
    def __init__(self) -> None:
        self.fence: Any = None

    @contextmanager
    def unit_of_work(self) -> Iterator[Any]:
        conn = object()                   # a connection of its own, as the pool gives
        yield conn
        if self.fence is not None:
            self.fence(conn)              # last, before the COMMIT


def test_only_the_leaves_own_unit_of_work_skips_the_fence_check(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    db = _Db()
    membership = Membership(db, "na", "na:2809", tmp_path, LeaseSettings(0.5, 2.0), lambda: None,
                            write_private=lambda p, t: None)
    membership.epoch = 3
    node: Any = object.__new__(Node)
    node.membership, node.s = membership, SimpleNamespace(node_id="na")
    db.fence = node._fence_check
    checked: list[Any] = []
    other = object()
    monkeypatch.setattr(M, "check", lambda conn, node_id, epoch: checked.append(conn))

    def leave(conn: Any, node_id: str, epoch: int) -> None:
        node._fence_check(other)          # another thread's unit of work ends while the node leaves

    monkeypatch.setattr(M, "leave", leave)
    membership.stop()
    assert checked == [other], "the concurrent unit of work is checked; the leave's own is not"
    node._fence_check(other)
    assert checked == [other, other], "after the leave, every unit of work is checked again"
