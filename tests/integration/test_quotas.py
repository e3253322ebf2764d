"""Per-node quotas (``[limits]``, router/quotas.py): an authorised but runaway client is refused with the spec's limit
exceptions once the node holds its limit of channels, admins, proxies or bridges; what exists keeps working."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from router.quotas import PROXY_LIMIT_NAME

from bridgekit import bridge_factory, channel_ep, jms_ep, unique_name
from conftest import NsjmsServer, started_node
from stdclients import persistent_qos

LIMITS = {"MAX_CHANNELS": "2", "MAX_ADMINS": "6", "MAX_PROXIES": "3", "MAX_BRIDGES": "1"}


@pytest.fixture
def limited(tmp_path: Path, fresh_db: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[NsjmsServer]:
    for key, value in LIMITS.items():
        monkeypatch.setenv(f"NSJMS_LIMITS_{key}", value)
    with started_node(tmp_path / "state", fresh_db, broker_url) as server:
        yield server


def admins(channel: Any) -> int:
    return len(channel.get_all_consumeradmins()) + len(channel.get_all_supplieradmins())


def test_limits_refuse_with_the_spec_exceptions(limited: NsjmsServer, client_orb: Any) -> None:
    factory = client_orb.factory(limited.ior())
    first, c1 = factory.create_channel(persistent_qos(), [])
    second, _ = factory.create_channel([], [])
    with pytest.raises(CORBA.IMP_LIMIT) as info:
        factory.create_channel([], [])
    assert info.value.completed == CORBA.COMPLETED_NO
    assert len(factory.get_all_channels()) == 2

    extra = []
    while admins(first) + admins(second) < 6:
        extra.append(first.new_for_consumers(CosNotifyChannelAdmin.AND_OP)[0])
    with pytest.raises(CORBA.IMP_LIMIT):
        second.new_for_suppliers(CosNotifyChannelAdmin.AND_OP)
    for made in extra:
        made.destroy()                                   # room for the bridges' admins below

    admin = first.default_consumer_admin
    proxies = [admin.obtain_notification_push_supplier(CosNotifyChannelAdmin.STRUCTURED_EVENT)[0] for _ in range(3)]
    with pytest.raises(CosNotifyChannelAdmin.AdminLimitExceeded) as limit:
        second.default_supplier_admin.obtain_notification_push_consumer(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    assert limit.value.admin_property_err.name == PROXY_LIMIT_NAME
    assert limit.value.admin_property_err.value.value() == 3

    bf = bridge_factory(client_orb, limited)
    with pytest.raises(CORBA.IMP_LIMIT):              # its channel proxy would pass the node's proxy limit
        bf.create_bridge(channel_ep(BA.SOURCE, c1), jms_ep(BA.SINK, unique_name("quota.q")))
    assert bf.get_all_bridges() == []
    for proxy in proxies[:2]:
        proxy.disconnect_structured_push_supplier()      # room for the bridges' proxies
    bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, c1), jms_ep(BA.SINK, unique_name("quota.q")))
    with pytest.raises(CORBA.IMP_LIMIT):              # the node's bridge limit (one more proxy would still fit)
        bf.create_bridge(channel_ep(BA.SOURCE, c1), jms_ep(BA.SINK, unique_name("quota.q")))
    assert "limit of 1 bridges" in limited.stderr_path.read_text()
    bridge.destroy()
    bf.create_bridge(channel_ep(BA.SOURCE, c1), jms_ep(BA.SINK, unique_name("quota.q")))   # room again
