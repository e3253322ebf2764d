"""The node's ORB arguments and the address it publishes for itself (router/node/server.py, router/node/cluster.py)."""

from __future__ import annotations

from pathlib import Path

from router.node.cluster import published_address
from router.node.server import NodeSettings, orb_args


def test_a_node_listening_on_every_address_publishes_the_endpoint_omniorb_is_told_to_publish() -> None:
    """The container image listens on 0.0.0.0 and sets ORBendPointPublish from ORB_PUBLISH_HOST: a node of a
    cluster named 0.0.0.0 as its own address in its references and its member row (found by the compose stack)."""
    assert published_address("giop:tcp:127.0.0.1:2810", "0.0.0.0", 2810) == "127.0.0.1:2810"
    assert published_address(" giop:tcp:router1.example:2809 ", "0.0.0.0", 2809) == "router1.example:2809"
    assert published_address("giop:tcp:[::1]:2809", "::", 2809) == "[::1]:2809"


def test_without_one_published_endpoint_the_node_names_its_listening_address() -> None:
    assert published_address("", "127.0.0.1", 2809) == "127.0.0.1:2809"
    for unusable in ("giop:tcp:a:1,giop:tcp:b:2", "giop:unix:/tmp/x", "giop:tcp:a:0", "giop:tcp:a:99999", "junk"):
        assert published_address(unusable, "10.0.0.5", 2809) == "10.0.0.5:2809", unusable


def test_a_clean_stop_does_not_wait_out_a_five_second_scavenger_scan(tmp_path: Path) -> None:
    args = orb_args(NodeSettings(state_dir=tmp_path))
    assert args[args.index("-ORBscanGranularity") + 1] == "1"
