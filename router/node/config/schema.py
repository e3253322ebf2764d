"""The configuration's keys: every section with its keys and each key's check (``_SCHEMA``)."""

from __future__ import annotations

from router.node.config.limits import MAX_GIOP_MAX_MSG_SIZE, MAX_MAX_EVENT_BYTES, MIN_MAX_EVENT_BYTES
from router.node.config.values import (
    _PORT,
    _addresses,
    _boolean,
    _broker_url,
    _dsn,
    _exporter,
    _file_name,
    _host,
    _http_url,
    _integer,
    _Key,
    _listen_address,
    _log_level,
    _node_id,
    _path,
    _placement,
    _string,
)

__all__: list[str] = []

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
                "placement": _Key(_placement), "peers": _Key(_addresses),
                "rebalance_on_join": _Key(_boolean)},
}
