"""A proxy's EnableTransaction = TRUE stored by an older nsjms version (accepted on the proxy and ignored; no
own-flag record) keeps its meaning at node start and is never silent (docs/qos.md, "Stored values").

The row is written as an older version left it (``qos.EnableTransaction = true``, no ``own_enable_transaction`` in
``extra``) while the node is stopped; the restarted node restores it with a WARNING naming the proxy and what the
value means now, and the proxy's client is served as before (not refused)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import CosNotifyChannelAdmin

from bridgekit import persistent_channel, reconnect_client, structured_supplier
from conftest import NsjmsServer
from stdclients import Form, PullConsumerClient, Style, make_event, obtain_proxy_supplier, wait_until

pytestmark = pytest.mark.integration

WAIT_S = 60.0


def test_a_pull_proxy_suppliers_stored_enable_transaction_is_reported_at_load_and_keeps_its_meaning(
        nsjms_server: NsjmsServer, factory: Any) -> None:
    channel, cid = persistent_channel(factory)
    admin, aid = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    proxy, pid = obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PULL)
    client = PullConsumerClient(proxy, Form.STRUCTURED)
    client.connect()
    nsjms_server.stop()
    with psycopg.connect(nsjms_server.pg_dsn, autocommit=True) as conn:    # as an older version stored it
        done = conn.execute("UPDATE nsjms_proxy SET qos = qos || '{\"EnableTransaction\": true}'::jsonb, "
                            "extra = extra - 'own_enable_transaction' "
                            "WHERE channel_id = %s AND side = 'C' AND admin_id = %s AND id = %s", (cid, aid, pid))
        assert done.rowcount == 1
    nsjms_server.restart()
    oid = f"ch/{cid}/C/{aid}/{pid}"
    log = nsjms_server.stderr_path.read_text(errors="replace")
    [line] = [ln for ln in log.splitlines() if "EnableTransaction is TRUE" in ln and "older nsjms version" in ln]
    assert "WARNING" in line and "pull proxy supplier" in line and "delivers without a routing transaction" in line
    assert oid in line, line
    reconnect_client(channel, proxy)
    structured_supplier(channel).push_all([make_event(1)])
    got: list[Any] = []

    def pulled() -> bool:
        got.extend(client.try_pull())
        return bool(got)

    assert wait_until(pulled, WAIT_S), "the client is not served"
