"""Coordinator of the routing transaction T2 (NJI 2.7): two-phase commit over PostgreSQL branches and the
broker send/ack, with a durable recovery log. Not yet implemented; see ``docs/architecture.md``."""
