"""A node's process-wide interpreter settings (``Node.tune_interpreter``, called by ``Node.start``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.node.server import GIL_SWITCH_INTERVAL_S, Node, NodeSettings


@pytest.fixture
def restored_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_node_shortens_the_thread_switch_interval(tmp_path: Path, restored_switch_interval: None) -> None:
    """A thread back from I/O (a servant whose commit returned) waits for the GIL at most about this long while a
    delivery thread runs Python code: 1 ms in a node, not CPython's 5 ms."""
    sys.setswitchinterval(0.005)
    Node(NodeSettings(state_dir=tmp_path)).tune_interpreter()
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    assert GIL_SWITCH_INTERVAL_S <= 0.001


def test_the_interval_is_a_node_setting(tmp_path: Path, restored_switch_interval: None) -> None:
    Node(NodeSettings(state_dir=tmp_path, gil_switch_interval_s=0.002)).tune_interpreter()
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_stop_gives_the_process_its_interval_back(tmp_path: Path, restored_switch_interval: None) -> None:
    sys.setswitchinterval(0.004)
    node = Node(NodeSettings(state_dir=tmp_path))
    node.tune_interpreter()
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    node.stop()                                  # never got the state directory's lock: still gives it back
    assert sys.getswitchinterval() == pytest.approx(0.004)
