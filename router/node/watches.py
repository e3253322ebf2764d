"""What a node checks before and while it serves: the start's checks (the ORB endpoint can be bound, an external
PostgreSQL answers and can prepare transactions), the service watches' probes (PostgreSQL on one kept connection,
the broker) and the ledger's periodic partition maintenance.

A mixin of :class:`router.node.server.Node`, which composes the parts it names (``s``, ``db``, ``runtime``, the
embedded services); kept apart so the node's start sequence (``server``) says one thing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("nsjms.server")

#: A failed ledger maintenance pass is tried again after at most this many seconds (not a whole period later).
LEDGER_RETRY_S = 60.0

__all__ = ["LEDGER_RETRY_S", "NodeWatches"]


class NodeWatches:
    """The start's checks, the service watches' probes and the periodic ledger maintenance of
    :class:`router.node.server.Node` (its attributes are the node's)."""

    s: Any
    db: Any
    runtime: Any
    pg_dsn: str
    broker_url: str
    broker_login: str
    broker_passcode: str
    embedded_pg: Any
    embedded_mq: Any
    health: dict[str, Any]
    watches: list[Any]
    _pg_probe: Any

    def _check_before_services(self) -> None:
        """What can end the start is checked before an embedded service is started, adopted or stopped."""
        from router.node.config import redact_dsn
        from router.node.lifecycle import ServiceError, ServiceUnreachable, bind_problem

        problem = bind_problem(self.s.orb_host, self.s.orb_port)
        if problem is not None:
            raise ServiceError(f"orb.host/orb.port: cannot listen on {self.s.orb_host}:{self.s.orb_port}: {problem}; "
                               "stop the process holding it or choose another orb.port")
        if self.pg_dsn:  # external: embedded services must not be touched for a node that cannot start
            problem = self._probe_pg_once()
            if problem is not None:
                raise ServiceUnreachable("postgres.dsn", redact_dsn(self.pg_dsn), problem)
            self._check_two_phase()

    def _check_two_phase(self) -> None:
        """T2 needs ``PREPARE TRANSACTION``: a server with ``max_prepared_transactions = 0`` is refused at start (the
        embedded cluster is started with 64)."""
        from router.db.twophase import max_prepared_transactions, prepared_transactions_problem
        from router.node.config import redact_dsn
        from router.node.lifecycle import ServiceMisconfigured

        value = max_prepared_transactions(self.pg_dsn, self.s.pg_connect_timeout_s)
        problem = None if value is None else prepared_transactions_problem(value)
        if problem is not None:
            raise ServiceMisconfigured("max_prepared_transactions",
                                       f"postgres.dsn {redact_dsn(self.pg_dsn)}: {problem}")

    def _check_services(self) -> None:
        """PostgreSQL must answer (bounded wait); an unreachable broker is reported loudly but not fatal."""
        from router.node.config import redact_dsn
        from router.node.lifecycle import Health, ServiceUnreachable, ServiceWatch

        pg = Health("postgres.dsn", redact_dsn(self.pg_dsn), self.embedded_pg is not None)
        mq = Health("broker.url", redact_dsn(self.broker_url), self.embedded_mq is not None)
        self.health = {"postgres": pg, "broker": mq}
        problem = self._probe_pg_once() if self.embedded_pg is not None else None  # an external one: before
        if problem is not None:
            raise ServiceUnreachable("postgres.dsn", pg.address, problem)
        pg.record_probe(None, time.time())
        problem = self._probe_broker()
        mq.record_probe(problem, time.time())
        if problem is not None:
            log.error("broker.url %s is unreachable at start (%s): the node serves CORBA clients; its bridges wait "
                      "and reconnect by themselves; `nsjms status` shows the broker's reachability",
                      mq.address, problem)
        interval = self.s.watch_interval_s
        self.watches = [ServiceWatch("PostgreSQL", pg, self._probe_pg, self.embedded_pg, interval=interval),
                        ServiceWatch("ActiveMQ", mq, self._probe_broker, self.embedded_mq, interval=interval)]

    def _probe_pg_once(self) -> str | None:
        """The start's checks: one connection, closed after (``lifecycle.probe_postgres``); the watch keeps one."""
        from router.node.lifecycle import probe_postgres

        return probe_postgres(self.pg_dsn, self.s.pg_connect_timeout_s)

    def _probe_pg(self) -> str | None:
        """The watch's probe, on one kept connection (router/db/health.py: a new one only when it fails, not every
        probe)."""
        from router.db.health import PostgresProbe
        from router.node.lifecycle import postgres_problem

        probe = self._pg_probe
        if probe is None or probe.dsn != self.pg_dsn:
            if probe is not None:
                probe.close()
            probe = self._pg_probe = PostgresProbe(self.pg_dsn, self.s.pg_connect_timeout_s)
        problem = probe.check()
        return None if problem is None else postgres_problem(problem)

    def _probe_broker(self) -> str | None:
        from router.node.lifecycle import probe_broker

        return probe_broker(self.broker_url, self.broker_login, self.broker_passcode, self.s.broker_connect_timeout_s)

    def maintain_ledger(self) -> bool:
        """Create the ledger's day partitions ahead and drop those past retention, in one short transaction of its
        own (never a routing transaction) that waits at most 2 s for the ledger's locks. A failure is logged and
        retried at the next period: until then rows of a day without a partition land in the default partition,
        and routing never waits for this. Returns whether it succeeded."""
        from router.routing.ledger import maintain

        settings = self.s.ledger            # also when ledger.enabled is false: retention still applies
        try:
            with self.db.unit_of_work() as conn:
                conn.execute("SET LOCAL lock_timeout = '2s'")
                created, dropped = maintain(conn, settings.retention_days, settings.ahead_days)
        except Exception as exc:  # noqa: BLE001 — a store error or lock timeout: retried soon
            log.warning("ledger partition maintenance failed (retried in %g s): %s", self._ledger_retry_s(), exc)
            return False
        if created or dropped:
            log.info("ledger partitions: created %s; dropped %s (retention %d days)",
                     ", ".join(map(str, created)) or "none", ", ".join(map(str, dropped)) or "none",
                     settings.retention_days)
        return True

    def _ledger_retry_s(self) -> float:
        """After a failed pass: the next one within a minute, not a whole period (an hour by default) later."""
        return float(min(self.s.ledger.maintenance_interval_s, LEDGER_RETRY_S))

    def _ledger_loop(self, last_ok: bool = True) -> None:
        """``last_ok``: whether the start's pass worked (if not, the first pass of the loop comes within a minute)."""
        wait = self.s.ledger.maintenance_interval_s if last_ok else self._ledger_retry_s()
        while not self.runtime.shutting_down.wait(wait):
            wait = self.s.ledger.maintenance_interval_s if self.maintain_ledger() else self._ledger_retry_s()
