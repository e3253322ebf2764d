"""The one vocabulary for a bridge's state, from the node snapshot's row (:meth:`router.bridge.bridge.BridgeImpl
.status`): what ``nsjms bridge list``, ``nsjms status`` and the console show. Pure; no I/O."""

from __future__ import annotations

from typing import Any

__all__ = ["REASONS", "STATES", "bridge_state"]

#: The one vocabulary for a bridge's state (``bridge list``, ``status``, docs): NJI 2.3 Active/Inactive, and for
#: an inactive bridge the reason, from the node's snapshot fields ``state``, ``started``, ``reason``, ``channel_id``.
STATES = {
    "active": "started, and both its channel and broker connections are up: events flow",
    "inactive": "not flowing; the reason follows: 'stopped' (never started or stopped; `bridge start ID`), "
                "'started, broker down; reconnecting' or 'started, channel not connected; reconnecting' (the bridge "
                "reconnects by itself), 'started, the broker refuses its subscription' (a selector or an "
                "authorization the broker refuses; retried with back-off) or 'channel N no longer exists: destroy "
                "this bridge'",
}

#: ``reason`` values of the node's snapshot (``BridgeImpl.inactive_reason``) as shown after ``[inactive]``.
REASONS = {
    "stopped": "stopped",
    "broker down": "started, broker down; reconnecting",
    "channel not connected": "started, channel not connected; reconnecting",
    "subscription refused": "started, the broker refuses its subscription (last error says why); retrying with "
                            "back-off",
}


def bridge_state(row: dict[str, Any], missing_channel: int | None = None) -> str:
    """``[active]`` or ``[inactive] REASON`` for one bridge from the node's snapshot row (``state``, ``started``,
    ``reason``, ``channel_id``); ``missing_channel``: a channel the caller found gone (fresher than the snapshot).
    Without a snapshot row only the administrative state is known: ``[inactive] stopped`` or ``[unknown] started``."""
    reason = row.get("reason")
    if missing_channel is not None or reason == "channel gone":
        cid = missing_channel if missing_channel is not None else row.get("channel_id")
        return f"[inactive] channel {cid} no longer exists: destroy this bridge"
    state = row.get("state")
    if state == "active":
        return "[active]"
    if state == "unreachable":
        return f"[unreachable] {reason}"
    if state == "inactive":
        return f"[inactive] {REASONS.get(str(reason), str(reason or 'unknown reason'))}"
    if row.get("started") is False:
        return "[inactive] stopped"
    return ("[unknown] started; not in this node's status snapshot (written every 2 s; a bridge another node of the "
            "cluster runs is in that node's)")
