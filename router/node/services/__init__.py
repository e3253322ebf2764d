"""Supervisors for private PostgreSQL and ActiveMQ instances living under a state directory.

``nsjms serve`` starts them when ``postgres.dsn`` / ``broker.url`` are empty; test fixtures start them when
no external service is given. Both listen on 127.0.0.1 only and survive a ``kill -9`` of their supervisor: the
next ``start()`` on the same state directory reuses the running PostgreSQL (same port) or stops it and starts
it again (other port), and reuses a leftover ActiveMQ (found through its pid file) when it is ours and healthy:
same ``activemq.xml`` (ports, credentials, policies) and an authenticated STOMP CONNECT answered; otherwise it
stops it and starts a fresh one. Callers must hold the state directory's lock (:mod:`router.node.lifecycle`) before
``start()``: it may stop a leftover service, which must never be one a live node owns.

Files are private: directories 0700, files 0600 (the broker runs with umask 0077; PostgreSQL sets its own).
With ``authenticate=True`` (what ``nsjms serve`` uses) the broker's STOMP and OpenWire connectors require the
login/passcode generated on first start and kept in ``activemq/credentials`` (mode 0600).

Layout under ``base_dir``::

    pg/            owned by the ``postgres`` OS user when running as root; also the unix socket directory
      data/        the cluster (initdb on first start)
      server.log
      password     generated superuser password for TCP connections (mode 0600)
    activemq/      activemq.xml, log4j.properties and log4j2.properties, lib/ (extra jars), data/ (the KahaDB store
                   and activemq.log, rotated at 10 MB x 5), tmp/, console.log, broker.pid, credentials (login and
                   generated passcode, mode 0600)

Exceptions: :class:`ServiceError` (missing binaries naming the apt package, busy port, start/stop timeout); the
tree is drawn in :mod:`router.node.lifecycle`.

Modules: ``postgres`` (:class:`~router.node.services.postgres.EmbeddedPostgres`), ``activemq``
(:class:`~router.node.services.activemq.EmbeddedActiveMQ`, the broker's configuration templates) and ``process`` (ports,
pids, log tails). The names callers use are exported here.
"""

from __future__ import annotations

from router.node.lifecycle import ServiceError, private_tree, stomp_probe
from router.node.services.activemq import BROKER_OS_USER, EmbeddedActiveMQ
from router.node.services.postgres import PG_OS_USER, EmbeddedPostgres
from router.node.services.process import free_port, wait_for_port

__all__ = [
    "BROKER_OS_USER",
    "PG_OS_USER",
    "EmbeddedActiveMQ",
    "EmbeddedPostgres",
    "ServiceError",
    "free_port",
    "private_tree",
    "stomp_probe",
    "wait_for_port",
]
