"""Several nodes on one PostgreSQL: membership with leases, epochs as fencing tokens, ownership of channels and
bridges (docs/cluster.md).

* :mod:`router.cluster.lease` — the decisions, free of I/O: who is expired, who owns a new object, what a
  survivor claims;
* :mod:`router.cluster.members` — the same in PostgreSQL (tables of migration 0005_cluster): join, renew, leave, fence a
  dead node, the fence check an ownership-dependent write runs in its own transaction, ownership rows.

Exceptions (one tree, :class:`ClusterError`)::

    ClusterError            a membership operation could not be done
    ├── Fenced              this node's epoch is no longer the live one: its work was taken over; stop and rejoin
    ├── NodeLive            the node id holds a live lease (another process with this id, or a lease not yet
    │                       expired)
    └── NotExpired          a takeover of a node whose lease has not expired was refused
"""

from router.cluster.errors import ClusterError, Fenced, NodeLive, NotExpired

__all__ = ["ClusterError", "Fenced", "NodeLive", "NotExpired"]
