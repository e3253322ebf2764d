"""The lists inside an item's page, paged, sorted and filtered like the main lists, each with its own query
parameters (``<prefix>_q``, ``<prefix>_sort``, ``<prefix>_desc``, ``<prefix>_page``, ``<prefix>_per_page``) so
that paging one keeps the others where they are:

* a channel's admins, proxies and filters (``adm``, ``px``, ``flt``), flattened from ``nsjms channel show``'s tree;
* a routing transaction's outbox and inbox rows (``out``, ``in``);
* the orphaned prepared branches under the transactions list (``orph``).

:func:`sub_page` is pure (the rows and the query's arguments in, a :class:`~router.console.views.Page` out); the
template builds each link with :func:`sub_url`, installed as a Jinja global by :func:`install`. An item's
``?format=json`` stays the whole item (what the CLI's ``--json`` prints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flask import Flask, request, url_for

from router.console.views import Page, paginate

__all__ = ["channel_subs", "install", "sub_page", "sub_url", "transaction_subs"]

SUB_PER_PAGE = 20
_KEYS = ("q", "sort", "desc", "page", "per_page")


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def sub_page(rows: Sequence[Mapping[str, Any]], args: Mapping[str, str], prefix: str, *, fields: Sequence[str],
             default_sort: str = "id") -> Page:
    """One sub-list's page by its prefixed query arguments."""
    return paginate(rows, q=args.get(f"{prefix}_q", ""), sort=args.get(f"{prefix}_sort", default_sort),
                    desc=args.get(f"{prefix}_desc") == "1", page=_int(args.get(f"{prefix}_page"), 1),
                    per_page=_int(args.get(f"{prefix}_per_page"), SUB_PER_PAGE), fields=fields)


def sub_url(prefix: str, **changes: Any) -> str:
    """The current page's URL with a sub-list's arguments changed (None removes one), the others kept."""
    args = {k: v for k, v in request.args.items() if k != "format"}
    for key, value in changes.items():
        name = f"{prefix}_{key}"
        if key not in _KEYS:
            raise ValueError(f"not a sub-list argument: {key}")
        if value is None or value == "":
            args.pop(name, None)
        else:
            args[name] = str(value)
    values: dict[str, Any] = {**(request.view_args or {}), **args}
    return url_for(str(request.endpoint), **values)


def install(app: Flask) -> None:
    app.jinja_env.globals["sub_url"] = sub_url


def _filters_text(filters: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"filter {f['id']}: " + ", ".join(
        f"[{', '.join(c['event_types']) or '*/*'}] {c['expression'] or 'TRUE'}" for c in f["constraints"])
        for f in filters)


def channel_subs(data: Mapping[str, Any], args: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """A channel's admins, proxies and filters (every admin's and proxy's), each one page."""
    admins, proxies, filters = [], [], []
    for side in ("consumer", "supplier"):
        for a in data.get(f"{side}_admins", []):
            admins.append({"id": a["id"], "side": side, "operator": a.get("operator"),
                           "proxies": len(a.get("proxies", [])), "filters": _filters_text(a.get("filters", []))})
            owners = [(f"{side} admin {a['id']}", a.get("filters", []))]
            for p in a.get("proxies", []):
                state = "-"
                if "connected" in p:
                    state = ("connected" if p["connected"] else "not connected") + (
                        ", suspended" if p.get("suspended") else "")
                proxies.append({"id": p["id"], "side": side, "admin": a["id"], "type": p.get("type"), "state": state,
                                "queued": p.get("queued"), "filters": _filters_text(p.get("filters", []))})
                owners.append((f"{side} admin {a['id']} proxy {p['id']}", p.get("filters", [])))
            for owner, fs in owners:
                for f in fs:
                    for c in f["constraints"] or [{"id": "-", "event_types": [], "expression": ""}]:
                        filters.append({"id": f["id"], "owner": owner, "grammar": f.get("grammar"),
                                        "constraint": c["id"], "types": ", ".join(c["event_types"]) or "*/*",
                                        "expression": c["expression"] or "TRUE"})
    return {
        "adm": sub_page(admins, args, "adm", fields=("id", "side", "operator", "filters")).as_dict(),
        "px": sub_page(proxies, args, "px", fields=("id", "side", "admin", "type", "state", "filters")).as_dict(),
        "flt": sub_page(filters, args, "flt", fields=("id", "owner", "grammar", "types", "expression")).as_dict(),
    }


def transaction_subs(data: Mapping[str, Any], args: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """A routing transaction's outbox and inbox rows, each one page."""
    return {"out": sub_page(data.get("outbox", []), args, "out", fields=("idx", "dedupe_id", "bridge_id",
                                                                         "destination"), default_sort="idx").as_dict(),
            "in": sub_page(data.get("inbox", []), args, "in", fields=("bridge_id", "message_id"),
                           default_sort="message_id").as_dict()}


def orphan_page(orphans: Sequence[Mapping[str, Any]], args: Mapping[str, str]) -> dict[str, Any]:
    """The orphaned prepared branches under the transactions list, one page."""
    return sub_page(orphans, args, "orph", fields=("gid", "gtrid", "owner", "reason"),
                    default_sort="age_s").as_dict()
