"""The sections of a node's configuration, one frozen dataclass each, and :class:`Config`, the whole of them
(the keys and their checks: :mod:`router.node.config.schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.node.config.limits import DEFAULT_MAX_EVENT_BYTES
from router.node.config.redact import _mask, redact_dsn
from router.node.config.schema import _SCHEMA

__all__ = [
    "BrokerConfig",
    "ClusterConfig",
    "Config",
    "ConsoleConfig",
    "LedgerConfig",
    "LimitsConfig",
    "NodeConfig",
    "OrbConfig",
    "PostgresConfig",
    "TelemetryConfig",
]


@dataclass(frozen=True)
class NodeConfig:
    """``[node]``: identity and local state of this process."""

    state_dir: Path = Path("./.nsjms")
    node_id: str = "node1"
    log_level: str = "INFO"
    #: The largest event the node handles, in bytes of its CDR encoding: the channel refuses a larger push
    #: (IMP_LIMIT), the ORB's giopMaxMsgSize is derived from it, a JMS -> channel bridge dead-letters a message
    #: whose event (or body) is larger. docs/configuration.md.
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES


@dataclass(frozen=True)
class OrbConfig:
    """``[orb]``: the IIOP endpoint of the channel factory."""

    host: str = "127.0.0.1"
    port: int = 2809
    max_threads: int = 64
    #: The ORB's giopMaxMsgSize; 0 = derived from node.max_event_bytes (default_giop_max_msg_size). Checked at load
    #: to be at least min_giop_max_msg_size(node.max_event_bytes).
    giop_max_msg_size: int = 0


@dataclass(frozen=True, repr=False)
class PostgresConfig:
    """``[postgres]``: empty ``dsn`` means "start the embedded cluster on ``embedded_port``"."""

    dsn: str = ""
    embedded_port: int = 55432
    pool_size: int = 8
    connect_timeout_s: int = 10  # bound of the start-up connection check (and of each reachability probe)

    @property
    def embedded(self) -> bool:
        return not self.dsn

    def __repr__(self) -> str:
        return (
            f"PostgresConfig(dsn={redact_dsn(self.dsn)!r}, embedded_port={self.embedded_port!r}, "
            f"pool_size={self.pool_size!r}, connect_timeout_s={self.connect_timeout_s!r})"
        )


@dataclass(frozen=True, repr=False)
class BrokerConfig:
    """``[broker]``: empty ``url`` means "start the embedded ActiveMQ on the ``embedded_*`` ports"."""

    url: str = ""
    login: str = ""
    passcode: str = field(default="")
    embedded_stomp_port: int = 61613
    embedded_openwire_port: int = 61616
    connect_timeout_s: int = 10  # bound of the start-up reachability check (and of each probe)
    amq_dupl_id: bool = False    # routing-transaction sends carry the dedupe id as _AMQ_DUPL_ID too (Artemis)

    @property
    def embedded(self) -> bool:
        return not self.url

    def __repr__(self) -> str:
        return (
            f"BrokerConfig(url={redact_dsn(self.url)!r}, login={self.login!r}, "
            f"passcode={_mask(self.passcode)!r}, embedded_stomp_port={self.embedded_stomp_port!r}, "
            f"embedded_openwire_port={self.embedded_openwire_port!r}, "
            f"connect_timeout_s={self.connect_timeout_s!r}, amq_dupl_id={self.amq_dupl_id!r})"
        )


@dataclass(frozen=True)
class TelemetryConfig:
    """``[telemetry]``: OpenTelemetry export. ``none`` keeps the API's no-op providers (zero cost)."""

    exporter: str = "none"          # none | console | prometheus | otlp
    interval_s: int = 30            # metric export interval (console, otlp)
    address: str = "127.0.0.1:9464"  # prometheus: where GET /metrics is served (loopback by default)
    otlp_endpoint: str = "http://127.0.0.1:4318"  # otlp: the collector's OTLP/HTTP base URL


@dataclass(frozen=True)
class LedgerConfig:
    """``[ledger]``: the delivery ledger the router writes (router/routing/ledger.py, docs/audit.md)."""

    enabled: bool = True            # rows for persistent (and transactional) traffic, in the routing transactions
    best_effort: bool = False       # rows for BestEffort events too
    retention_days: int = 30        # day partitions older than this many whole days are dropped
    ahead_days: int = 3             # day partitions created ahead of today
    maintenance_interval_s: int = 3600  # how often the node ensures partitions and drops expired ones


@dataclass(frozen=True)
class LimitsConfig:
    """``[limits]``: per-node quotas (router/quotas.py, docs/security.md); 0 = no limit."""

    max_channels: int = 1000
    max_admins: int = 10000
    max_proxies: int = 20000
    max_bridges: int = 1000


@dataclass(frozen=True)
class ConsoleConfig:
    """``[console]``: the operator web console (router/console, docs/console.md); off unless enabled."""

    enabled: bool = False
    host: str = "127.0.0.1"         # loopback by default: nothing outside the machine reaches it
    port: int = 8460
    tls_cert: str = ""              # PEM certificate chain; with tls_key: https and Secure cookies
    tls_key: str = ""               # PEM private key (keep it 0600)
    audit_reports: str = ""         # the audit reports the console lists and starts; empty: <state_dir>/audit


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the membership lease of nodes sharing one PostgreSQL (router/cluster, docs/cluster.md)."""

    renew_s: int = 2                # how often the node renews its lease (ActiveMQ Artemis's JDBC default)
    expiry_s: int = 20              # a lease not renewed for this long is taken over; at least 3 x renew_s
    placement: str = "creator"      # who owns a new channel: "creator" or "least-loaded" (docs/cluster.md)
    rebalance_on_join: bool = False  # a node that joins asks for its share of the channels (docs/cluster.md)
    #: The other nodes' ORB addresses (``host:port``), published as alternate IIOP addresses in every reference of
    #: this node, with the members PostgreSQL knows at start (docs/cluster.md, "CORBA addressing").
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    """The whole validated configuration of one node. Build it with :func:`load_config`."""

    node: NodeConfig = field(default_factory=NodeConfig)
    orb: OrbConfig = field(default_factory=OrbConfig)
    postgres: PostgresConfig = field(default_factory=PostgresConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def redacted(self) -> dict[str, dict[str, Any]]:
        """A plain dict safe to log or print: DSN/URL passwords and ``broker.passcode`` become ``***``."""
        out: dict[str, dict[str, Any]] = {}
        for section, keys in _SCHEMA.items():
            values = getattr(self, section)
            out[section] = {key: spec.show(getattr(values, key)) for key, spec in keys.items()}
        return out
