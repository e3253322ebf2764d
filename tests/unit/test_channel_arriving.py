"""A channel a node has claimed from a dead node but not loaded yet (router/cluster/takeover.py): the factory tells a
client to retry (TRANSIENT), not that the channel does not exist (ChannelNotFound, which a client may act on); once
loaded, or gone from the database meanwhile, the usual answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from omniORB import CORBA

import CosNotifyChannelAdmin

from router.channel.channel import EventChannelFactoryImpl
from router.cluster.forward import Forwarder


class _Store:
    def max_seq(self, conn: Any) -> int:
        return 0

    def load_channels(self, conn: Any) -> list[Any]:
        return []                                   # destroyed meanwhile: nothing to load


class _Db:
    @contextmanager
    def unit_of_work(self) -> Iterator[None]:
        yield None


def test_a_claimed_channel_not_loaded_yet_answers_transient_then_not_found_once_gone() -> None:
    rt = SimpleNamespace(db=_Db(), store=_Store(), raise_seq_floor=lambda seq: None, poa=None,
                         forwarder=Forwarder(None))     # a node outside a cluster: nothing runs elsewhere
    factory = EventChannelFactoryImpl(rt)  # type: ignore[arg-type]
    factory.arrive([3])
    with pytest.raises(CORBA.TRANSIENT):
        factory.get_event_channel(3)
    with pytest.raises(CosNotifyChannelAdmin.ChannelNotFound):
        factory.get_event_channel(4)                 # not claimed: not found, as before
    assert factory.adopt([3]) == []
    with pytest.raises(CosNotifyChannelAdmin.ChannelNotFound):
        factory.get_event_channel(3)                 # the claim found no such channel: no endless retry
