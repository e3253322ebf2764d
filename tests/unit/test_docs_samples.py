"""Samples in docs/ that users copy, checked against what the code produces (issue 29: a stale endpoints.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _json_block_after(page: str, marker: str) -> dict[str, Any]:
    text = (DOCS / page).read_text()
    block = re.search(r"```json\n(.*?)```", text[text.index(marker):], re.S)
    assert block is not None, f"no JSON sample after {marker!r} in {page}"
    return dict(json.loads(block.group(1)))


def test_channel_md_endpoints_sample_matches_what_the_node_writes() -> None:
    from router.node.server import Node

    class _Orb:
        def object_to_string(self, ref: Any) -> str:
            return "IOR:..."

    fake = SimpleNamespace(s=SimpleNamespace(orb_host="127.0.0.1", orb_port=2809, node_id="node1"), orb=_Orb(),
                           factory=SimpleNamespace(ref=None), bridges=SimpleNamespace(ref=None),
                           txn_admin=SimpleNamespace(ref=None), dead_letter_admin=SimpleNamespace(ref=None),
                           pg_dsn="postgresql://postgres:secret@127.0.0.1:55432/nsjms",
                           broker_url="stomp://127.0.0.1:61613")
    written = Node.endpoints(fake)  # type: ignore[arg-type]
    sample = _json_block_after("channel.md", "On start the node writes")
    assert sorted(sample) == sorted(written)
    written["pid"] = sample["pid"]
    assert sample == written
