"""Coordinator of the routing transaction T2 (NJI 2.7): two-phase commit over PostgreSQL branches and the broker
send/ack branch, with a durable recovery log and recovery. See ``docs/transactions.md``.

Modules: ``errors`` (the exception tree), ``states`` (state table), ``xid`` (node-scoped ids, dedupe ids),
``resource`` (participant / resource-manager / clock contracts), ``records`` + ``log`` (the recovery log),
``coordinator``, ``recovery``, ``pg`` (PostgreSQL branches), ``testing`` (in-memory twins for unit tests).
Built and tested as a layer; not yet wired into the router's data paths.
"""
