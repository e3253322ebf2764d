"""The node's routing transactions (T2, NJI 2.7) and their operator tools (``nsjms txn``), beside the T2 runner.

* :mod:`router.routing.t2.transactions`: :class:`NodeTransactions`, one per node: coordinator, recovery log,
  recovery at start and periodically, the inbox table, the outbox's purge;
* :mod:`router.routing.t2.latecommit`: PostgreSQL branches committed by someone other than their T2's driver, told to
  the running channels;
* :mod:`router.routing.t2.view`, :mod:`router.routing.t2.ops`, :mod:`router.routing.t2.admin`: ``nsjms txn``: the
  joined operator view (pure), its I/O layer, ``NsjmsAdmin::TransactionAdmin`` for the running node.

See docs/architecture.md and docs/transactions.md.
"""
