"""The node's registry of local endpoints and the one "could not forward" error tree (router/routing, issue 24)."""

from __future__ import annotations

import pickle
from typing import Any

from router.bridge.ports import ForwardDeferred as BridgeForwardDeferred
from router.channel.txdelivery import ForwardFailed as ChannelForwardFailed
from router.routing.errors import ForwardDeferred, ForwardError, ForwardFailed, refused_content
from router.routing.registry import LocalEndpoint, LocalEndpoints


class Servant:
    pass


class _Batches:
    def running(self) -> bool:
        return True


def Batches() -> Any:           # a stand-in for the bridge's LocalBatches, not type-checked here
    return _Batches()


def Participant() -> Any:       # a stand-in for OutboundT2 / a pull sender
    return object()


def _resolver(table: dict[str, object]) -> Any:
    def resolve(ref: Any) -> object | None:
        if ref == "broken":
            raise RuntimeError("the POA cannot resolve it")
        return table.get(ref)

    return resolve


def test_a_registered_endpoint_is_found_by_any_reference_to_its_servant() -> None:
    servant, batches = Servant(), Batches()
    endpoints = LocalEndpoints(_resolver({"IOR:a": servant, "IOR:a-other-spelling": servant}))
    endpoints.add(servant, LocalEndpoint(batches=batches))
    assert endpoints.outbound_batches("IOR:a") is batches
    assert endpoints.outbound_batches("IOR:a-other-spelling") is batches
    assert endpoints.outbound_t2("IOR:a") is None            # a port it does not offer
    assert endpoints.inbound("IOR:a") is None


def test_the_t2_participant_is_added_later_and_everything_goes_with_remove() -> None:
    servant, batches, participant = Servant(), Batches(), Participant()
    endpoints = LocalEndpoints(_resolver({"IOR:a": servant}))
    endpoints.add(servant, LocalEndpoint(batches=batches))
    endpoints.update(servant, t2=participant)
    assert endpoints.outbound_t2("IOR:a") is participant
    assert endpoints.outbound_batches("IOR:a") is batches      # kept
    endpoints.remove(servant)
    assert endpoints.endpoint("IOR:a") is None
    assert endpoints.servant("IOR:a") is servant               # still a servant of this node, no longer an endpoint


def test_a_remote_a_plain_local_or_an_unresolvable_reference_finds_no_endpoint() -> None:
    servant, plain = Servant(), Servant()
    endpoints = LocalEndpoints(_resolver({"IOR:a": servant, "IOR:plain": plain}))
    endpoints.add(servant, LocalEndpoint(inbound=Participant()))
    assert endpoints.inbound("IOR:remote") is None
    assert endpoints.inbound("IOR:plain") is None             # a servant of this node that is not a bridge endpoint
    assert endpoints.servant("broken") is None                # the resolver's failure: not a local object
    assert endpoints.inbound("broken") is None
    assert LocalEndpoints().endpoint("IOR:a") is None         # a registry without a POA finds nothing


def test_one_error_tree_defined_once_and_reexported_where_it_was() -> None:
    assert BridgeForwardDeferred is ForwardDeferred and ChannelForwardFailed is ForwardFailed
    assert issubclass(ForwardDeferred, ForwardError) and issubclass(ForwardFailed, ForwardError)
    failed = pickle.loads(pickle.dumps(ForwardFailed("broker refused", content=True)))
    assert (failed.reason, failed.content) == ("broker refused", True)
    assert refused_content(failed)
    assert not refused_content(ForwardFailed("broker down", content=False))
    assert not refused_content(ForwardDeferred("stopped"))
    assert not refused_content(RuntimeError("anything else"))
