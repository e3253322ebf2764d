"""Node configuration: one frozen :class:`Config` from a TOML file, the environment and explicit overrides.

Precedence, lowest to highest::

    built-in defaults  <  TOML file  <  NSJMS_<SECTION>_<KEY> environment variables  <  overrides (CLI flags)

Every value is validated when the configuration is loaded. A problem raises :class:`ConfigError` whose message
names the key and where the value came from, e.g. ``orb.port (from NSJMS_ORB_PORT): expected an integer
1-65535, got 'abc'``. Values of secret-bearing keys (DSNs, broker URLs, ``broker.passcode``) are redacted in
error messages, in :meth:`Config.redacted` and in ``repr``: credentials must never reach a log.

Environment variables whose section part is not a known section (``NSJMS_TEST_PG_DSN``, ``NSJMS_CONFIG``) are
not configuration keys and are ignored; an unknown key in a known section (``NSJMS_ORB_PROT``) is an error.

Exceptions::

    ValueError
     └── ConfigError        bad file, unknown section/key, wrong type or out-of-range value
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = [
    "BROKER_SCHEMES",
    "CONFIG_ENV",
    "DEFAULT_MAX_EVENT_BYTES",
    "ENV_PREFIX",
    "BrokerConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "LedgerConfig",
    "LimitsConfig",
    "NodeConfig",
    "OrbConfig",
    "PostgresConfig",
    "broker_addresses",
    "load_config",
    "redact_dsn",
]

ENV_PREFIX = "NSJMS_"
#: ``node.max_event_bytes``: the one event size limit of a node (CDR-encoded StructuredEvent), see NodeConfig.
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
MIN_MAX_EVENT_BYTES = 64 * 1024
MAX_MAX_EVENT_BYTES = 256 * 1024 * 1024     # the ORB's giopMaxMsgSize (4x + 1 MiB) stays well below 4 GiB
GIOP_HEADROOM = 1024 * 1024                 # GIOP/request headers and a few small events around a big one
MAX_GIOP_MAX_MSG_SIZE = 2**32 - 1           # omniORB's giopMaxMsgSize is a CORBA::ULong
CONFIG_ENV = "NSJMS_CONFIG"  # path of the TOML file when none is given explicitly
REDACTED = "***"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_HOST = re.compile(r"[A-Za-z0-9.:_-]{1,253}")
_URL_START = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
_SECRET_KEYS = ("password", "sslpassword", "passcode")
_SECRET_ALT = "|".join(_SECRET_KEYS)
_KV_SECRET = re.compile(rf"(\b(?:{_SECRET_ALT})\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s]*)", re.IGNORECASE)
_QUERY_SECRET = re.compile(rf"([?&](?:{_SECRET_ALT})=)([^&#]*)", re.IGNORECASE)


def default_giop_max_msg_size(max_event_bytes: int) -> int:
    """The ORB's ``giopMaxMsgSize`` when ``orb.giop_max_msg_size`` is not set: 4 x ``node.max_event_bytes`` + 1 MiB.

    Well above the event limit, so a push of an event even several times too large reaches the channel, which
    answers ``IMP_LIMIT`` (do not retry), instead of the ORB cutting the connection (``COMM_FAILURE``, which
    suppliers retry: issue 31, a 20 MB push against a 17 MiB ORB limit)."""
    return 4 * max_event_bytes + GIOP_HEADROOM


def min_giop_max_msg_size(max_event_bytes: int) -> int:
    """The smallest ``orb.giop_max_msg_size`` accepted: 2 x ``node.max_event_bytes`` + 1 MiB, so a push of an event
    at the limit, and every message the channel sends, fit in one ORB message."""
    return 2 * max_event_bytes + GIOP_HEADROOM


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and the source of the bad value."""

    def __init__(self, message: str, key: str = "", source: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.source = source

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.key, self.source))


# --------------------------------------------------------------------------------------- redaction
def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``.

    Handles URLs (``postgresql://user:pw@host/db``, ``stomp://user:pw@host:61613``, ``?password=`` query
    parameters) and libpq ``key=value`` strings (``password=pw``, ``password='p w'``). When in doubt it
    removes more, never less.
    """
    if not dsn:
        return dsn
    if _URL_START.match(dsn):
        return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, _redact_userinfo(dsn))
    return _KV_SECRET.sub(lambda m: m.group(1) + REDACTED, dsn)


def _redact_or_hide(value: str) -> str:
    """Redact a value that should hold credentials; hide it entirely when its shape is not recognisable."""
    if _URL_START.match(value) or re.match(r"^\s*[A-Za-z_]+\s*=", value):
        return redact_dsn(value)
    return f"<{len(value)} characters, not shown>"


def _redact_userinfo(url: str) -> str:
    scheme_end = url.index("://") + 3
    head_end = min(
        (i for i in (url.find("?", scheme_end), url.find("#", scheme_end)) if i >= 0), default=len(url)
    )
    at = url.rfind("@", scheme_end, head_end)
    if at < 0:
        return url
    colon = url.find(":", scheme_end, at)
    if colon < 0:
        return url
    return url[: colon + 1] + REDACTED + url[at:]


# ---------------------------------------------------------------------------------------- sections
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
    """``[ledger]``: the delivery ledger the router writes (router/ledger.py, docs/audit.md)."""

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
    #: The other nodes' ORB addresses (``host:port``), published as alternate IIOP addresses in every reference of
    #: this node, with the members PostgreSQL knows at start (docs/cluster.md, "CORBA addressing").
    peers: tuple[str, ...] = ()


def _mask(secret: str) -> str:
    return REDACTED if secret else ""


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


# ------------------------------------------------------------------------------------------ schema
Parser = Callable[[Any, bool], Any]  # (raw value, came from text?) -> typed value; raises _Invalid


class _Invalid(Exception):
    """Internal: a value failed its check; carries the expectation for the error message."""


@dataclass(frozen=True)
class _Key:
    parse: Parser
    secret: bool = False  # the whole value is secret
    has_credentials: bool = False  # the value may embed a password (DSN, URL)

    def show(self, value: Any) -> Any:
        if self.secret:
            return _mask(str(value))
        if self.has_credentials:
            return redact_dsn(str(value))
        return str(value) if isinstance(value, Path) else value

    def describe(self, raw: Any) -> str:
        if self.secret:
            return repr(REDACTED)
        if self.has_credentials and isinstance(raw, str):
            return repr(_redact_or_hide(raw))
        return repr(raw)


def _integer(low: int, high: int) -> Parser:
    def parse(raw: Any, textual: bool) -> int:
        value = raw
        if textual and isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            value = int(raw)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"expected an integer {low}-{high}")
        return value

    return parse


def _boolean(raw: Any, textual: bool) -> bool:
    if isinstance(raw, bool):
        return raw
    if textual and isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return raw.strip().lower() in ("true", "1", "yes")
    raise _Invalid("expected a boolean (true/false)")


def _string(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str):
        raise _Invalid("expected a string")
    return raw


def _path(raw: Any, textual: bool) -> Path:
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise _Invalid("expected a non-empty path")
    return Path(raw).expanduser()


def _node_id(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or not _NODE_ID.fullmatch(raw):
        raise _Invalid("expected 1-32 characters from [A-Za-z0-9_-]")
    return raw


def _log_level(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or raw.strip().upper() not in LOG_LEVELS:
        raise _Invalid("expected one of " + ", ".join(LOG_LEVELS))
    return raw.strip().upper()


def _host(raw: Any, textual: bool) -> str:
    if not isinstance(raw, str) or not _HOST.fullmatch(raw):
        raise _Invalid("expected a host name or IP address")
    return raw


def _dsn(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    if not value:
        return ""
    expectation = "expected a postgresql:// URL, a key=value DSN or an empty string"
    if _URL_START.match(value) and urlsplit(value).scheme not in ("postgresql", "postgres"):
        raise _Invalid(expectation)
    try:
        conninfo_to_dict(value)
    except psycopg.ProgrammingError as exc:
        raise _Invalid(expectation) from exc
    return value


BROKER_SCHEMES = ("stomp", "stomp+ssl")  # the node's transports (router.jms.transport's table, minus memory://)


def _broker_url(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    if not value:
        return ""
    expectation = (
        "expected a URL stomp://HOST:PORT or stomp+ssl://HOST:PORT (failover: HOST:PORT,HOST:PORT) or an empty string"
    )
    if not _URL_START.match(value):
        raise _Invalid(expectation)
    parts = urlsplit(value)
    if parts.scheme.lower() not in BROKER_SCHEMES:
        raise _Invalid(f"unsupported scheme {parts.scheme + '://'!r}; {expectation}")
    if "@" in parts.netloc:
        raise _Invalid("credentials do not belong in the URL: set broker.login and broker.passcode")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _Invalid(expectation)
    for item in parts.netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _Invalid(expectation)
    return value


def broker_addresses(url: str) -> list[tuple[str, int]]:
    """``[(host, port), ...]`` of a URL accepted by ``broker.url`` (empty for an empty URL)."""
    if not url:
        return []
    out = []
    for item in urlsplit(url).netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


_PORT = _integer(1, 65535)


EXPORTERS = ("none", "console", "prometheus", "otlp")


def _exporter(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip().lower()
    if value not in EXPORTERS:
        raise _Invalid("expected one of " + ", ".join(repr(e) for e in EXPORTERS))
    return value


PLACEMENTS = ("creator", "least-loaded")


def _placement(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip().lower()
    if value not in PLACEMENTS:
        raise _Invalid("expected one of " + ", ".join(repr(p) for p in PLACEMENTS))
    return value


def _listen_address(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    host, _, port = value.rpartition(":")
    if not _HOST.fullmatch(host.strip("[]") or "-") or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _Invalid("expected HOST:PORT, e.g. 127.0.0.1:9464")
    return value


def _addresses(raw: Any, textual: bool) -> tuple[str, ...]:
    """HOST:PORT list: a TOML array of strings, or text with the addresses separated by commas or spaces."""
    items = raw if isinstance(raw, list) else re.split(r"[\s,]+", _string(raw, textual).strip())
    out = []
    for item in items:
        if not isinstance(item, str):
            raise _Invalid("expected HOST:PORT addresses")
        if item.strip():
            host, _, port = item.strip().rpartition(":")
            if not _HOST.fullmatch(host.strip("[]") or "-") or not port.isdigit() or not 0 < int(port) <= 65535:
                raise _Invalid(f"expected HOST:PORT addresses, e.g. 10.0.0.2:2809,10.0.0.3:2809 (got {item!r})")
            out.append(item.strip())
    return tuple(out)


def _http_url(raw: Any, textual: bool) -> str:
    value = _string(raw, textual).strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Invalid("expected an http:// or https:// URL, e.g. http://127.0.0.1:4318")
    return value


def _file_name(raw: Any, textual: bool) -> str:
    """A path kept as text ("" = unset); relative paths in a file are anchored at the file (``_anchor_path``)."""
    value = _string(raw, textual).strip()
    return str(Path(value).expanduser()) if value else ""


_SCHEMA: dict[str, dict[str, _Key]] = {
    "node": {"state_dir": _Key(_path), "node_id": _Key(_node_id), "log_level": _Key(_log_level),
             "max_event_bytes": _Key(_integer(MIN_MAX_EVENT_BYTES, MAX_MAX_EVENT_BYTES))},
    "orb": {"host": _Key(_host), "port": _Key(_PORT), "max_threads": _Key(_integer(1, 4096)),
            "giop_max_msg_size": _Key(_integer(0, MAX_GIOP_MAX_MSG_SIZE))},
    "postgres": {
        "dsn": _Key(_dsn, has_credentials=True),
        "embedded_port": _Key(_PORT),
        "pool_size": _Key(_integer(1, 1024)),
        "connect_timeout_s": _Key(_integer(1, 300)),
    },
    "broker": {
        "url": _Key(_broker_url, has_credentials=True),
        "login": _Key(_string),
        "passcode": _Key(_string, secret=True),
        "embedded_stomp_port": _Key(_PORT),
        "embedded_openwire_port": _Key(_PORT),
        "connect_timeout_s": _Key(_integer(1, 300)),
        "amq_dupl_id": _Key(_boolean),
    },
    "telemetry": {"exporter": _Key(_exporter), "interval_s": _Key(_integer(1, 3600)),
                  "address": _Key(_listen_address), "otlp_endpoint": _Key(_http_url, has_credentials=True)},
    "ledger": {"enabled": _Key(_boolean), "best_effort": _Key(_boolean),
               "retention_days": _Key(_integer(1, 36500)), "ahead_days": _Key(_integer(0, 366)),
               "maintenance_interval_s": _Key(_integer(60, 86400))},
    "limits": {"max_channels": _Key(_integer(0, 1_000_000)), "max_admins": _Key(_integer(0, 1_000_000)),
               "max_proxies": _Key(_integer(0, 1_000_000)), "max_bridges": _Key(_integer(0, 1_000_000))},
    "console": {"enabled": _Key(_boolean), "host": _Key(_host), "port": _Key(_PORT),
                "tls_cert": _Key(_file_name), "tls_key": _Key(_file_name),
                "audit_reports": _Key(_file_name)},
    "cluster": {"renew_s": _Key(_integer(1, 60)), "expiry_s": _Key(_integer(3, 600)),
                "placement": _Key(_placement), "peers": _Key(_addresses)},
}
_SECTION_TYPES: dict[str, type] = {
    "node": NodeConfig,
    "orb": OrbConfig,
    "postgres": PostgresConfig,
    "broker": BrokerConfig,
    "telemetry": TelemetryConfig,
    "ledger": LedgerConfig,
    "limits": LimitsConfig,
    "console": ConsoleConfig,
    "cluster": ClusterConfig,
}


# ----------------------------------------------------------------------------------------- loading
@dataclass
class _Layer:
    """Raw values from one source, keyed ``(section, key)``, each with a human-readable source label."""

    values: dict[tuple[str, str], tuple[Any, str, bool]] = field(default_factory=dict)

    def put(self, section: str, key: str, raw: Any, source: str, textual: bool) -> None:
        _check_known(section, key, source)
        self.values[(section, key)] = (raw, source, textual)


def _check_known(section: str, key: str, source: str) -> None:
    if section not in _SCHEMA:
        raise ConfigError(
            f"[{section}] (from {source}): unknown section; known: {', '.join(_SCHEMA)}", section, source
        )
    if key not in _SCHEMA[section]:
        raise ConfigError(
            f"{section}.{key} (from {source}): unknown key; known in [{section}]: "
            f"{', '.join(_SCHEMA[section])}",
            f"{section}.{key}",
            source,
        )


def _file_layer(path: Path) -> _Layer:
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(
            f"cannot read configuration file {path}: {exc.strerror or exc}", "", source
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", "", source) from exc
    layer = _Layer()
    for section, table in data.items():
        if section in _SCHEMA and not isinstance(table, dict):
            raise ConfigError(f"[{section}] (from {source}): expected a table", section, source)
        if not isinstance(table, dict):
            raise ConfigError(
                f"{section} (from {source}): unknown top-level key; known sections: {', '.join(_SCHEMA)}",
                section,
                source,
            )
        for key, raw in table.items():
            layer.put(section, key, _anchor_path(section, key, raw, path), source, textual=False)
    return layer


def _anchor_path(section: str, key: str, raw: Any, config_file: Path) -> Any:
    """A relative path in a configuration file is relative to that file, not to the caller's directory."""
    spec = _SCHEMA.get(section, {}).get(key)
    if spec is None or spec.parse not in (_path, _file_name) or not isinstance(raw, str) or not raw.strip():
        return raw
    candidate = Path(raw).expanduser()
    if candidate.is_absolute():
        return raw
    return str(config_file.resolve().parent / candidate)


def _env_layer(env: Mapping[str, str]) -> _Layer:
    layer = _Layer()
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if section in _SCHEMA:
            layer.put(section, key, raw, name, textual=True)
    return layer


def _override_layer(overrides: Mapping[str, Any], source: str) -> _Layer:
    layer = _Layer()
    for dotted, raw in overrides.items():
        if raw is None:
            continue  # an unset CLI flag
        section, _, key = dotted.partition(".")
        layer.put(section, key, raw, f"{source} {dotted}", textual=isinstance(raw, str))
    return layer


def _build(layers: list[_Layer]) -> Config:
    merged: dict[tuple[str, str], tuple[Any, str, bool]] = {}
    for layer in layers:
        merged.update(layer.values)
    sections: dict[str, Any] = {}
    for section, keys in _SCHEMA.items():
        kwargs = {
            key: _parse_one(section, key, spec, merged[(section, key)])
            for key, spec in keys.items()
            if (section, key) in merged
        }
        sections[section] = _SECTION_TYPES[section](**kwargs)
    config = Config(**sections)
    _check_cross(config, merged)
    return config


def _parse_one(section: str, key: str, spec: _Key, entry: tuple[Any, str, bool]) -> Any:
    raw, source, textual = entry
    try:
        return spec.parse(raw, textual)
    except _Invalid as exc:
        raise ConfigError(
            f"{section}.{key} (from {source}): {exc}, got {spec.describe(raw)}", f"{section}.{key}", source
        ) from None


def _check_cross(config: Config, merged: dict[tuple[str, str], tuple[Any, str, bool]]) -> None:
    _check_giop(config, merged)
    _check_cluster(config, merged)
    console = config.console
    if bool(console.tls_cert) != bool(console.tls_key):
        key = "tls_key" if console.tls_cert else "tls_cert"
        entry = merged.get(("console", "tls_cert" if console.tls_cert else "tls_key"))
        raise ConfigError(f"console.{key} (from {entry[1] if entry else 'defaults'}): TLS needs both console.tls_cert "
                          "and console.tls_key", f"console.{key}", entry[1] if entry else "defaults")
    broker = config.broker
    if not broker.embedded or broker.embedded_stomp_port != broker.embedded_openwire_port:
        return
    key, other = "embedded_openwire_port", "embedded_stomp_port"
    if ("broker", key) not in merged:
        key, other = other, key
    entry = merged.get(("broker", key))
    source = entry[1] if entry else "defaults"
    raise ConfigError(
        f"broker.{key} (from {source}): must differ from broker.{other}, got {getattr(broker, key)} for both",
        f"broker.{key}",
        source,
    )


def _check_giop(config: Config, merged: dict[tuple[str, str], tuple[Any, str, bool]]) -> None:
    """``orb.giop_max_msg_size`` must stay comfortably above ``node.max_event_bytes``: otherwise a push the channel
    would refuse with IMP_LIMIT is cut off by the ORB with COMM_FAILURE, which suppliers retry."""
    giop, event = config.orb.giop_max_msg_size, config.node.max_event_bytes
    least = min_giop_max_msg_size(event)
    if not giop or giop >= least:
        return
    entry = merged.get(("orb", "giop_max_msg_size"))
    source = entry[1] if entry else "defaults"
    raise ConfigError(
        f"orb.giop_max_msg_size (from {source}): must be at least 2 x node.max_event_bytes + 1 MiB = {least} "
        f"(node.max_event_bytes is {event}), so that a push of a too large event reaches the channel and gets "
        f"IMP_LIMIT instead of COMM_FAILURE from the ORB; got {giop} (0 or unset: {default_giop_max_msg_size(event)})",
        "orb.giop_max_msg_size",
        source,
    )


def _check_cluster(config: Config, merged: dict[tuple[str, str], tuple[Any, str, bool]]) -> None:
    """A lease must survive two missed renewals: ``cluster.expiry_s >= 3 x cluster.renew_s``."""
    renew, expiry = config.cluster.renew_s, config.cluster.expiry_s
    if expiry >= 3 * renew:
        return
    key = "expiry_s" if ("cluster", "expiry_s") in merged or ("cluster", "renew_s") not in merged else "renew_s"
    entry = merged.get(("cluster", key))
    source = entry[1] if entry else "defaults"
    raise ConfigError(f"cluster.{key} (from {source}): cluster.expiry_s must be at least 3 x cluster.renew_s "
                      f"({3 * renew}) so a lease survives two missed renewals, got expiry_s {expiry}, renew_s {renew}",
                      f"cluster.{key}", source)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    override_source: str = "command line",
) -> Config:
    """Load and validate the configuration.

    ``path``: TOML file; when ``None``, the file named by ``$NSJMS_CONFIG`` if set, else no file (defaults).
    ``env``: the environment to read ``NSJMS_<SECTION>_<KEY>`` from (default ``os.environ``).
    ``overrides``: ``{"orb.port": 2810, "postgres.dsn": "..."}``, typically from CLI flags; ``None`` values
    are ignored so unset flags pass straight through. ``override_source`` labels them in error messages.
    """
    environ = os.environ if env is None else env
    if path is None and environ.get(CONFIG_ENV):
        path = environ[CONFIG_ENV]
    layers = [_file_layer(Path(path))] if path is not None else []
    layers.append(_env_layer(environ))
    layers.append(_override_layer(overrides or {}, override_source))
    return _build(layers)
