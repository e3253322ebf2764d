"""Global transaction ids of T2, scoped to one node, in psycopg's :class:`~psycopg.Xid` (JDBC-compatible) form.

* ``format_id`` is fixed for nsjms: :data:`FORMAT_ID` (``0x6E736A31``, ASCII ``"nsj1"``).
* ``gtrid`` is ``"<node>:<token>"``: the node id (``[A-Za-z0-9_-]{1,32}``, as in ``router.node.config``) and a
  24-hex-digit token (48 bits of wall-clock milliseconds + 48 random bits), at most 57 characters (the XA
  limit is 64). The node id in every gtrid is what lets a node recognise its own branches in
  ``tpc_recover()`` output: anything with another format id, an unparsable gtrid or another node is foreign
  and never touched (:func:`is_ours`).
* ``bqual`` (branch qualifier) is the participant's branch name (``[A-Za-z0-9_.-]{1,64}``), unique inside one
  transaction (e.g. ``"channel-queue"``, ``"outbox"``), so each PostgreSQL branch has its own prepared xid.
* A message's dedupe id is ``"<gtrid>/<index>"`` (:func:`dedupe_id`): the gtrid of the T2 that sent it and the
  message's 0-based position in that T2. It is computed once when the outbox row is written and stored with
  the row, so a re-send by recovery carries exactly the same id; it is unique across nodes (node id) and
  transactions (token), and deterministic (no clock or randomness at re-send time).

PostgreSQL stores the xid as the GID ``<format_id>_<base64 gtrid>_<base64 bqual>`` (psycopg/pgjdbc encoding).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import Xid

from .errors import ForeignXid, UsageError

__all__ = [
    "FORMAT_ID", "GlobalId", "NodeId", "branch_xid", "check_branch", "dedupe_id", "is_ours", "new_gtrid",
    "parse_gtrid", "require_ours",
]

FORMAT_ID = 0x6E736A31  # "nsj1"
_NODE = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TOKEN = re.compile(r"[0-9a-f]{24}")
_BRANCH = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_GTRID = re.compile(r"(?P<node>[A-Za-z0-9_-]{1,32}):(?P<token>[0-9a-f]{24})")


@dataclass(frozen=True)
class NodeId:
    """This node's id; validated like ``router.node.config``'s ``node.node_id``."""

    value: str

    def __post_init__(self) -> None:
        if not _NODE.fullmatch(self.value):
            raise UsageError(f"node id {self.value!r}: expected 1-32 characters from [A-Za-z0-9_-]")

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GlobalId:
    """A parsed gtrid."""

    node: str
    token: str

    def __str__(self) -> str:
        return f"{self.node}:{self.token}"


def new_gtrid(
    node: NodeId, *, wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> str:
    """A fresh gtrid for ``node``: unique (48 random bits per millisecond) and roughly time-ordered."""
    token = f"{wall_ms() & 0xFFFF_FFFF_FFFF:012x}{random_bytes(6).hex()}"
    return f"{node.value}:{token}"


def parse_gtrid(gtrid: str) -> GlobalId | None:
    """The node and token of an nsjms gtrid, or None when ``gtrid`` is not one."""
    match = _GTRID.fullmatch(gtrid)
    return GlobalId(match["node"], match["token"]) if match else None


def check_branch(name: str) -> str:
    """``name`` if it is a valid branch qualifier, else :class:`UsageError`."""
    if not _BRANCH.fullmatch(name):
        raise UsageError(f"branch name {name!r}: expected 1-64 characters from [A-Za-z0-9_.-]")
    return name


def branch_xid(gtrid: str, branch: str) -> Xid:
    """The xid of one participant's branch of ``gtrid``."""
    if parse_gtrid(gtrid) is None:
        raise UsageError(f"not an nsjms gtrid: {gtrid!r}", gtrid=gtrid)
    return Xid.from_parts(FORMAT_ID, gtrid, check_branch(branch))


def is_ours(xid: Xid, node: NodeId) -> bool:
    """True only for an xid of nsjms's format whose gtrid names ``node``; everything else is foreign."""
    if xid.format_id != FORMAT_ID or xid.bqual is None:
        return False
    parsed = parse_gtrid(xid.gtrid)
    return parsed is not None and parsed.node == node.value


def require_ours(xid: Xid, node: NodeId) -> Xid:
    """``xid`` if :func:`is_ours`, else :class:`ForeignXid`."""
    if not is_ours(xid, node):
        raise ForeignXid(f"xid {xid} does not belong to node {node.value}", gtrid=xid.gtrid)
    return xid


def dedupe_id(gtrid: str, index: int) -> str:
    """The dedupe id of the ``index``-th (0-based) message sent in ``gtrid`` (see the module docstring)."""
    if parse_gtrid(gtrid) is None:
        raise UsageError(f"not an nsjms gtrid: {gtrid!r}", gtrid=gtrid)
    if index < 0:
        raise UsageError(f"message index must be >= 0, got {index}", gtrid=gtrid)
    return f"{gtrid}/{index}"
