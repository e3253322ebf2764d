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

The package, one module per concept (everything public is importable from here, ``router.node.config``)::

    limits.py    the node's event size limit and the ORB message size derived from it
    redact.py    credentials in DSNs and URLs redacted
    values.py    the value parsers and ``_Key`` (a key's parser and secrecy)
    schema.py    the sections and their keys (``_SCHEMA``)
    sections.py  the section dataclasses and ``Config``
    load.py      the layers (file < environment < overrides) merged, parsed and cross-checked: ``load_config``
    errors.py    ``ConfigError``
"""

from __future__ import annotations

from router.node.config.errors import ConfigError
from router.node.config.limits import (
    DEFAULT_MAX_EVENT_BYTES,
    GIOP_HEADROOM,
    MAX_GIOP_MAX_MSG_SIZE,
    MAX_MAX_EVENT_BYTES,
    MIN_MAX_EVENT_BYTES,
    default_giop_max_msg_size,
    min_giop_max_msg_size,
)
from router.node.config.load import CONFIG_ENV, ENV_PREFIX, load_config
from router.node.config.redact import REDACTED, redact_dsn
from router.node.config.sections import (
    BrokerConfig,
    ClusterConfig,
    Config,
    ConsoleConfig,
    LedgerConfig,
    LimitsConfig,
    NodeConfig,
    OrbConfig,
    PostgresConfig,
    TelemetryConfig,
)
from router.node.config.values import BROKER_SCHEMES, EXPORTERS, LOG_LEVELS, PLACEMENTS, Parser, broker_addresses

__all__ = [
    "BROKER_SCHEMES",
    "CONFIG_ENV",
    "DEFAULT_MAX_EVENT_BYTES",
    "ENV_PREFIX",
    "EXPORTERS",
    "GIOP_HEADROOM",
    "LOG_LEVELS",
    "MAX_GIOP_MAX_MSG_SIZE",
    "MAX_MAX_EVENT_BYTES",
    "MIN_MAX_EVENT_BYTES",
    "PLACEMENTS",
    "REDACTED",
    "BrokerConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "LedgerConfig",
    "LimitsConfig",
    "NodeConfig",
    "OrbConfig",
    "Parser",
    "PostgresConfig",
    "TelemetryConfig",
    "broker_addresses",
    "default_giop_max_msg_size",
    "load_config",
    "min_giop_max_msg_size",
    "redact_dsn",
]
