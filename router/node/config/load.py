"""Loading: the layers of a configuration (file, environment, overrides) merged, parsed and cross-checked into
one :class:`~router.node.config.sections.Config` (:func:`load_config`)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.node.config.errors import ConfigError
from router.node.config.limits import default_giop_max_msg_size, min_giop_max_msg_size
from router.node.config.schema import _SCHEMA
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
from router.node.config.values import _file_name, _Invalid, _Key, _path

__all__ = ["CONFIG_ENV", "ENV_PREFIX", "load_config"]

ENV_PREFIX = "NSJMS_"
CONFIG_ENV = "NSJMS_CONFIG"  # path of the TOML file when none is given explicitly

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
