"""Coordinator of the routing transaction T2 (NJI 2.7): two-phase commit over PostgreSQL branches and the broker
send/ack branch, with a durable recovery log and recovery. See ``docs/transactions.md``.

Modules: ``errors`` (the exception tree), ``states`` (state table), ``xid`` (node-scoped ids, dedupe ids),
``resource`` (participant / resource-manager / clock contracts), ``records`` + ``log`` (the recovery log),
``coordinator``, ``recovery``, ``pg`` (PostgreSQL branches), ``observer`` (the hook telemetry and the ledger use),
``testing`` (in-memory twins for unit tests).

A layer that imports no nsjms package (an import-linter contract), wired into the node:
``router/routing/t2/transactions.py`` makes the node's coordinator over its file log and the recovery manager, and runs
recovery at start and periodically; both data paths run in T2 when ``EnableTransaction`` is on (channel → JMS:
``router/channel/txdelivery.py`` with the bridge's send branch, ``router/bridge/txout.py`` and ``txbranch.py``; JMS →
channel: ``router/channel/t2in.py`` with ``router/bridge/t2in.py``); ``nsjms txn`` (``router/routing/t2/view.py``,
``ops.py``, ``cli/txn.py``) reads and resolves its log; ``router/routing/ledger.py`` and ``router/telemetry.py``
observe it.
"""
