"""Independence of consumers: a slow consumer and dead consumers must not delay a healthy one or the supplier.

A behaviour check with generous bounds, not a benchmark: the slow consumer sleeps ``SLOW_DELAY_S`` per event
(500 events would take it over 15 minutes), one dead consumer's servant is deactivated (calls raise
OBJECT_NOT_EXIST) and another's reference points at a closed port (calls raise TRANSIENT). The healthy consumer
must still get all ``N_EVENTS`` within ``BOUND_S`` and the supplier's pushes must not wait for anyone.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import CosNotifyComm

from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    deactivate,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    unreachable_reference,
)

pytestmark = pytest.mark.integration

N_EVENTS = 500
SLOW_DELAY_S = 2.0
BOUND_S = 20.0
S = Form.STRUCTURED


def test_slow_and_dead_consumers_do_not_delay_others(factory: Any, client_orb: Any) -> None:
    channel, _ = factory.create_channel([], [])
    admin = channel.default_consumer_admin
    slow = StructuredPushConsumer()
    slow.delay = SLOW_DELAY_S
    connect_push_consumer(obtain_proxy_supplier(admin, S, Style.PUSH)[0], S, slow)
    dead = StructuredPushConsumer()
    connect_push_consumer(obtain_proxy_supplier(admin, S, Style.PUSH)[0], S, dead)
    deactivate(dead)  # the channel now gets OBJECT_NOT_EXIST
    unreachable_proxy, _ = obtain_proxy_supplier(admin, S, Style.PUSH)
    unreachable_proxy.connect_structured_push_consumer(
        unreachable_reference(client_orb.orb, CosNotifyComm.StructuredPushConsumer))  # TRANSIENT
    healthy = StructuredPushConsumer()
    connect_push_consumer(obtain_proxy_supplier(admin, S, Style.PUSH)[0], S, healthy)
    supplier = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)[0], S)
    supplier.connect()
    try:
        t0 = time.monotonic()
        supplier.push_all([make_event(i) for i in range(N_EVENTS)])
        push_s = time.monotonic() - t0
        assert healthy.wait_for(N_EVENTS, BOUND_S), (
            f"healthy consumer got {healthy.count()}/{N_EVENTS} within {BOUND_S} s next to slow/dead consumers")
        elapsed = time.monotonic() - t0
        assert push_s < BOUND_S, f"the supplier was held up: {push_s:.1f} s for {N_EVENTS} pushes"
        assert sorted(healthy.ids()) == list(range(N_EVENTS))
        assert slow.count() <= elapsed / SLOW_DELAY_S + 2, "the slow consumer was not actually slow"
        assert dead.count() == 0
    finally:
        slow.stop.set()  # release the slow servant's sleeping calls
