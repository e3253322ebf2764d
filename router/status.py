"""``nsjms status``: what a running node publishes, asked over IIOP with the standard interfaces only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["collect", "render"]


def collect(state_dir: Path) -> dict[str, Any]:
    """Endpoints plus, per channel, its admins, proxies and queue depth as the factory reports them."""
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    from omniORB import CORBA
    import CosNotifyChannelAdmin

    orb = CORBA.ORB_init(["nsjms-status", "-ORBclientCallTimeOutPeriod", "5000"], CORBA.ORB_ID)
    try:
        factory = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])._narrow(
            CosNotifyChannelAdmin.EventChannelFactory)
        channels = []
        for cid in factory.get_all_channels():
            ch = factory.get_event_channel(cid)
            channels.append({
                "id": cid,
                "consumer_admins": list(ch.get_all_consumeradmins()),
                "supplier_admins": list(ch.get_all_supplieradmins()),
                "proxy_suppliers": sum(len(ch.get_consumeradmin(a)._get_push_suppliers())
                                       + len(ch.get_consumeradmin(a)._get_pull_suppliers())
                                       for a in ch.get_all_consumeradmins()),
            })
    except CORBA.TRANSIENT as exc:
        raise ConnectionError(f"{endpoints['event_channel_factory']['corbaloc']}: {exc}") from exc
    finally:
        orb.destroy()
    return {"endpoints": endpoints, "channels": channels}


def render(report: dict[str, Any]) -> str:
    ep = report["endpoints"]
    lines = [
        f"node        {ep.get('node_id')} (pid {ep.get('pid')})",
        f"factory     {ep['event_channel_factory']['corbaloc']}",
        f"bridges     {ep['bridge_factory']['corbaloc'] if ep.get('bridge_factory') else '-'}",
        f"postgres    {ep.get('postgres_dsn')}",
        f"broker      {ep.get('broker_url') or '-'}",
        f"channels    {len(report['channels'])}",
    ]
    for ch in report["channels"]:
        lines.append(f"  channel {ch['id']}: consumer admins {ch['consumer_admins']}, "
                     f"supplier admins {ch['supplier_admins']}, proxy suppliers {ch['proxy_suppliers']}")
    return "\n".join(lines)
