"""One event size limit per node: ``node.max_event_bytes`` feeds the channel runtime, the ORB's giopMaxMsgSize,
the JMS -> channel bridge's event limit and the mapping's body limit (issue 7, "Poison events and messages").

Before, the channel refused above 8 MiB, the bridge dead-lettered above 1 MiB and the mapping refused bodies above
64 MiB, none of them configurable: a message between the limits took a path the others did not expect."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from router import cli
from router.bridge import flows
from router.bridge.bridge import BrokerSettings
from router.channel.boundary import DEFAULT_MAX_EVENT_BYTES, giop_max_msg_size
from router.node.config import ConfigError, load_config
from router.node.server import Node, NodeSettings, orb_args

MIB = 1024 * 1024


def _giop(args: list[str]) -> int:
    return int(args[args.index("-ORBgiopMaxMsgSize") + 1])


def _settings_from(argv: list[str], env: dict[str, str]) -> NodeSettings:
    args = cli.build_parser().parse_args(["serve", *argv])
    for name, value in cli.GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    with mock.patch.dict(os.environ, env, clear=True):
        settings: NodeSettings = cli._settings(cli._load(args))
    return settings


def test_one_default_everywhere() -> None:
    assert load_config(env={}).node.max_event_bytes == 8 * MIB
    assert DEFAULT_MAX_EVENT_BYTES == flows.MAX_EVENT_BYTES == BrokerSettings("stomp://x:1").max_event_bytes == 8 * MIB
    settings = _settings_from([], {})
    assert settings.max_event_bytes == 8 * MIB
    assert _giop(orb_args(settings)) == giop_max_msg_size(8 * MIB)


@pytest.mark.parametrize(("argv", "env"), [
    (["--max-event-bytes", str(MIB)], {}),
    ([], {"NSJMS_NODE_MAX_EVENT_BYTES": str(MIB)}),
], ids=["flag", "env"])
def test_the_key_feeds_orb_channel_bridge_and_mapping(argv: list[str], env: dict[str, str],
                                                      tmp_path: Path) -> None:
    settings = _settings_from([*argv, "--state-dir", str(tmp_path)], env)
    assert settings.max_event_bytes == MIB
    assert _giop(orb_args(settings)) == 4 * MIB + giop_max_msg_size(0), "ORB derived from the same limit"
    broker = Node(settings).broker_settings()
    assert broker.max_event_bytes == MIB, "bridge events and mapped bodies use the node's limit"


def test_the_channel_runtime_gets_the_limit(tmp_path: Path) -> None:
    """Node._start_channel builds the Runtime with the node's limit (the Runtime refuses larger pushes)."""
    settings = NodeSettings(state_dir=tmp_path, max_event_bytes=2 * MIB)
    node = Node(settings)
    seen: dict[str, int] = {}

    class Stop(Exception):
        pass

    def runtime(orb: object, db: object, store: object, *, max_event_bytes: int) -> object:
        seen["max_event_bytes"] = max_event_bytes
        raise Stop

    with mock.patch("router.channel.runtime.Runtime", runtime), \
            mock.patch("omniORB.CORBA.ORB_init", return_value=object()), \
            mock.patch("router.db.Database") as db, pytest.raises(Stop):
        db.return_value.open.return_value = None
        node._start_channel()
    assert seen == {"max_event_bytes": 2 * MIB}


@pytest.mark.parametrize("value", ["0", "abc", str(64 * 1024 - 1), str(256 * MIB + 1)])
def test_out_of_range_is_a_configuration_error_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={"NSJMS_NODE_MAX_EVENT_BYTES": value})
    assert "node.max_event_bytes (from NSJMS_NODE_MAX_EVENT_BYTES)" in str(exc.value)


def test_the_orb_limit_is_comfortably_above_the_event_limit() -> None:
    """Issue 31: a 20 MB push got COMM_FAILURE from the ORB's 17 MiB limit (2 x 8 MiB + 1 MiB) instead of the
    channel's IMP_LIMIT; suppliers retry COMM_FAILURE. The default now lets pushes up to 4 x the limit reach the
    channel."""
    settings = _settings_from([], {})
    assert _giop(orb_args(settings)) == 4 * 8 * MIB + MIB
    assert _giop(orb_args(settings)) > 20 * 1000 * 1000 + MIB


def test_orb_giop_max_msg_size_is_configurable_and_checked(tmp_path: Path) -> None:
    settings = _settings_from(["--state-dir", str(tmp_path)], {"NSJMS_ORB_GIOP_MAX_MSG_SIZE": str(100 * MIB)})
    assert _giop(orb_args(settings)) == 100 * MIB
    assert load_config(env={"NSJMS_ORB_GIOP_MAX_MSG_SIZE": str(17 * MIB)}).orb.giop_max_msg_size == 17 * MIB
    with pytest.raises(ConfigError) as info:
        load_config(env={"NSJMS_ORB_GIOP_MAX_MSG_SIZE": str(17 * MIB - 1)})
    assert info.value.key == "orb.giop_max_msg_size"
    message = str(info.value)
    assert "NSJMS_ORB_GIOP_MAX_MSG_SIZE" in message and "at least" in message and str(17 * MIB) in message
    with pytest.raises(ConfigError, match=r"orb\.giop_max_msg_size"):
        load_config(env={"NSJMS_ORB_GIOP_MAX_MSG_SIZE": str(3 * MIB), "NSJMS_NODE_MAX_EVENT_BYTES": str(2 * MIB)})
