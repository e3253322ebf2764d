"""The lists inside an item's page (a channel's admins, proxies and filters; a transaction's outbox and inbox; the
orphaned branches under the transactions list) paged, sorted and filtered like the main lists, each by its own
query arguments (router/console/sublists.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from test_console_app import FakeBackend, login

from router.console.app import create_app
from router.console.sublists import channel_subs, sub_page
from router.console.views import RateSampler
from router.security.auth import Principal, Role, issue


def _filter(fid: int, expr: str) -> dict[str, Any]:
    return {"id": fid, "grammar": "EXTENDED_TCL", "constraints": [{"id": 0, "event_types": ["d/t"],
                                                                   "expression": expr}]}


class BigBackend(FakeBackend):
    def channel(self, who: Principal, cid: int) -> dict[str, Any]:
        proxies = [{"id": i, "type": "STRUCTURED_PUSH", "connected": i % 2 == 0, "suspended": False, "queued": i,
                    "filters": [_filter(100 + i, f"$n == {i}")]} for i in range(45)]
        return {"id": 1, "qos": {}, "admin": {}, "events_held": 0, "snapshot_age_s": 1.0,
                "consumer_admins": [{"id": a, "operator": "AND_OP", "filters": [_filter(a, "TRUE")],
                                     "proxies": proxies if a == 0 else []} for a in range(30)],
                "supplier_admins": []}

    def transaction(self, gtrid: str) -> dict[str, Any]:
        view = super().transaction(gtrid)
        view["outbox"] = [{"idx": i, "dedupe_id": f"d{i}", "bridge_id": 5, "destination": "queue/q"}
                          for i in range(55)]
        return view


@pytest.fixture
def client(tmp_path: Path) -> FlaskClient:
    secret = issue(tmp_path, "reader", Role.READER).read_text().strip().partition(":")[2]
    backend = BigBackend(tmp_path)
    c = create_app(backend, sampler=RateSampler(backend.snapshot)).test_client()
    login(c, "reader", secret)
    return c


def _rows(html: str, table: str) -> int:
    body = html.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return body.count("<tr>") - 1


def test_a_channels_admins_proxies_and_filters_are_paged_each_on_its_own(client: FlaskClient) -> None:
    html = client.get("/channels/1").get_data(as_text=True)
    assert (_rows(html, "admins"), _rows(html, "proxies"), _rows(html, "filters")) == (20, 20, 20)
    assert "showing 20 of 30 admin(s), page 1 of 2" in html and "showing 20 of 45 proxy(ies), page 1 of 3" in html
    assert "showing 20 of 75 constraint(s)" in html         # 30 admins' filters and 45 proxies'
    nxt = re.search(r'href="([^"]+)" id="px-next"', html)
    assert nxt is not None
    url = nxt.group(1).replace("&amp;", "&")
    page2 = client.get(url + "&adm_page=2").get_data(as_text=True)
    assert "showing 20 of 45 proxy(ies), page 2 of 3" in page2 and "of 30 admin(s), page 2 of 2" in page2
    third = client.get("/channels/1?px_page=3&adm_page=2").get_data(as_text=True)
    assert "showing 5 of 45 proxy(ies), page 3 of 3" in third
    assert re.search(r'href="[^"]*adm_page=2[^"]*px_page=2', third) or re.search(
        r'href="[^"]*px_page=2[^"]*adm_page=2', third), "paging one list keeps the other's page"
    found = client.get("/channels/1?flt_q=%24n+%3D%3D+44").get_data(as_text=True)
    assert "showing 1 of 1 constraint(s) (filtered)" in found and "$n == 44" in found
    desc = client.get("/channels/1?px_sort=queued&px_desc=1").get_data(as_text=True)
    assert desc.split('<table id="proxies">')[1].split("<tr>")[2].count("<td>44</td>") == 2   # id and queued 44
    whole = client.get("/channels/1?format=json").get_json()
    assert len(whole["consumer_admins"][0]["proxies"]) == 45, "the JSON stays the whole channel"


def test_a_transactions_outbox_and_the_orphans_are_paged(client: FlaskClient) -> None:
    html = client.get("/transactions/node1:abc").get_data(as_text=True)
    assert _rows(html, "outbox") == 20 and "showing 20 of 55 row(s), page 1 of 3" in html
    last = client.get("/transactions/node1:abc?out_page=3").get_data(as_text=True)
    assert _rows(last, "outbox") == 15 and "<code>d54</code>" in last
    listing = client.get("/transactions?orph_q=nothing-like-it").get_data(as_text=True)
    assert "showing 0 of 0 branch(es) (filtered)" in listing


def test_sub_page_reads_only_its_own_arguments() -> None:
    rows = [{"id": i} for i in range(50)]
    p = sub_page(rows, {"a_page": "2", "b_page": "3", "a_per_page": "10"}, "a", fields=("id",))
    assert (p.page, p.per_page, [r["id"] for r in p.rows][:2]) == (2, 10, [10, 11])
    subs = channel_subs({"consumer_admins": [], "supplier_admins": []}, {})
    assert subs["adm"]["total"] == subs["px"]["total"] == subs["flt"]["total"] == 0
