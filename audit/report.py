"""The audit's JSON summary and self-contained HTML report (PNG plots by matplotlib, embedded as base64)."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from audit.job import AuditRequest

__all__ = ["bridge_table", "node_table", "open_figure", "summary", "violations", "write"]

_ID_LIMIT = 100
_BRIDGE_STATUSES = ("delivered", "duplicated", "resent", "lost", "in_doubt", "in_flight", "dead_letter", "discarded",
                    "expired")


def bridge_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``bridge_counts`` rows → one row per (direction, bridge) with a column per status (0 when none); bridge
    ``-``: the channel's own CORBA consumers (no bridge)."""
    table: dict[tuple[str, Any], dict[str, Any]] = {}
    for r in rows:
        key = (r["direction"] or "-", r["bridge_id"])
        row = table.setdefault(key, {"direction": key[0], "bridge": "-" if key[1] is None else key[1],
                                     **dict.fromkeys(_BRIDGE_STATUSES, 0)})
        row[r["status"]] = row.get(r["status"], 0) + int(r["obligations"])
    return [table[k] for k in sorted(table, key=lambda k: (k[0], -1 if k[1] is None else k[1]))]


def node_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``node_counts`` rows → one row per node with a column per status (0 when none) and ``multi_node`` (the
    obligations among them whose rows name more than one node); node ``-``: no row of the obligation names one
    (written before the ledger had a node column, outside a routing transaction)."""
    table: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = "-" if r["node"] is None else str(r["node"])
        row = table.setdefault(key, {"node": key, **dict.fromkeys(_BRIDGE_STATUSES, 0), "multi_node": 0})
        row[r["status"]] = row.get(r["status"], 0) + int(r["obligations"])
        row["multi_node"] += int(r["multi_node"])
    return [table[k] for k in sorted(table)]


def _utc(value: Any) -> Any:
    """PySpark returns naive datetimes in the driver's local time zone; make them aware UTC."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


#: The columns of the duplicates and re-sends the page shows (the page is 1000 px wide; the Parquet tables have all).
_NARROW = ("dedupe_id", "direction", "bridge_id", "deliveries", "distinct_gtrids", "nodes", "last_delivered_at")


def _narrow(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in _NARROW} for r in rows]


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: _utc(v) for k, v in r.items()} for r in rows]


def violations(lost: int, duplicated: int, max_lost: int, max_duplicates: int) -> list[str]:
    """What breaks the guarantees: more lost or duplicated obligations than allowed (default: none)."""
    out = []
    if lost > max_lost:
        out.append(f"{lost} lost (allowed {max_lost})")
    if duplicated > max_duplicates:
        out.append(f"{duplicated} duplicated (allowed {max_duplicates})")
    return out


def summary(frames: dict[str, list[dict[str, Any]]], req: AuditRequest, master: str) -> dict[str, Any]:
    """The JSON summary; ``master``: the Spark master the job ran on."""
    by_status: dict[str, int] = {}
    by_direction: dict[str, dict[str, int]] = {}
    for r in frames["status_counts"]:
        by_status[r["status"]] = by_status.get(r["status"], 0) + int(r["obligations"])
        by_direction.setdefault(r["direction"], {})[r["status"]] = int(r["obligations"])
    lost, duplicated = by_status.get("lost", 0), by_status.get("duplicated", 0)
    resent = frames.get("resent", [])
    dead: dict[str, int] = {}
    for r in frames["dead_letters"]:
        dead[r["failure_reason"]] = dead.get(r["failure_reason"], 0) + int(r["dead_letters"])
    latency: dict[str, dict[str, dict[str, float]]] = {}
    for r in frames["latency_percentiles"]:
        latency.setdefault(r["hop"], {})[r["direction"]] = {
            k: r[k] for k in ("samples", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")}
    per_minute: dict[str, int] = {}
    for r in frames["throughput_totals"]:
        key = _utc(r["minute"])
        per_minute[key] = per_minute.get(key, 0) + int(r["delivered"])
    return {
        "generated_at": datetime.now(UTC).isoformat(),
        "source": req.source, "master": master,
        "window": {"from": _utc(req.start), "to": _utc(req.end)},
        "as_of": _utc(req.as_of), "grace_s": req.grace.total_seconds(),
        "obligations": sum(by_status.values()), "by_status": by_status, "by_direction": by_direction,
        "lost": lost, "duplicated": duplicated,
        # a takeover's documented re-send (docs/cluster.md): delivered twice with one nsjms_dedupe_id, one row by the
        # dead node and one by its survivor; reported, never a violation (docs/audit.md, "Nodes")
        "resent": by_status.get("resent", 0),
        "resent_ids": sorted(r["dedupe_id"] for r in resent)[:_ID_LIMIT],
        "extra_deliveries_listed": sum(int(r["deliveries"]) - 1 for r in frames["duplicates"]),
        "stuck_in_doubt": int(frames["stuck_in_doubt_total"][0]["transactions"]), "dead_letters": dead,
        "lost_ids": sorted(r["dedupe_id"] for r in frames["lost"])[:_ID_LIMIT],
        "duplicate_ids": sorted(r["dedupe_id"] for r in frames["duplicates"])[:_ID_LIMIT],
        "stuck_gtrids": sorted(r["gtrid"] for r in frames["stuck_in_doubt"])[:_ID_LIMIT],
        "latency_ms": latency,
        "by_bridge": bridge_table(frames.get("bridge_counts", [])),
        "by_node": node_table(frames.get("node_counts", [])),
        "throughput": {"minutes": len(per_minute), "delivered": sum(per_minute.values()),
                       "peak_per_minute": max(per_minute.values(), default=0),
                       "first_minute": min(per_minute, default=None), "last_minute": max(per_minute, default=None)},
        "limits": {"max_lost": req.max_lost, "max_duplicates": req.max_duplicates},
        "violations": violations(lost, duplicated, req.max_lost, req.max_duplicates),
    }


def write(out: Path, summ: dict[str, Any], frames: dict[str, list[dict[str, Any]]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summ, indent=2, sort_keys=True, default=str) + "\n")
    plots = {"throughput": _plot_throughput(frames["throughput_totals"]),
             "latency": _plot_latency(frames["latency_histogram"], frames["latency_percentiles"]),
             "faults": _plot_faults(summ),
             "open": _png(open_figure(frames.get("open_per_minute", []),
                                      [*frames.get("duplicates", []), *frames.get("resent", [])]))}
    (out / "plots").mkdir(exist_ok=True)
    for name, png in plots.items():
        (out / "plots" / f"{name}.png").write_bytes(png)
    (out / "report.html").write_text(_html(summ, frames, plots), encoding="utf-8")


# ------------------------------------------------------------------------------------------- plots
def _figure() -> Any:
    from matplotlib.figure import Figure  # the object API renders with Agg; no pyplot, no GUI backend

    return Figure(figsize=(9, 3.6), dpi=100, layout="constrained")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _plot_throughput(rows: list[dict[str, Any]]) -> bytes:
    return _png(throughput_figure(rows))


def throughput_figure(rows: list[dict[str, Any]]) -> Any:
    """Deliveries per minute, one panel per direction on a shared time axis: in one panel, two directions carrying
    the same traffic (the demo's round trip) drew one line exactly over the other, and one series was hidden."""
    series: dict[str, tuple[list[datetime], list[int]]] = {}
    for r in sorted(rows, key=lambda r: (r["direction"], r["minute"])):
        xs, ys = series.setdefault(r["direction"], ([], []))
        xs.append(r["minute"])
        ys.append(int(r["delivered"]))
    fig = _figure()
    if not series:
        ax = fig.add_subplot()
        ax.set_title("Throughput: deliveries per minute (UTC)")
        ax.text(0.5, 0.5, "no deliveries", ha="center", transform=ax.transAxes)
        return fig
    fig.set_figheight(1.2 + 2.0 * len(series))
    axes = fig.subplots(len(series), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (direction, (xs, ys)), color in zip(axes, series.items(), ("tab:blue", "tab:orange", "tab:green",
                                                                          "tab:red"), strict=False):
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, color=color, label=direction)
        ax.set_ylabel("delivered / min")
        ax.legend(loc="upper right")
    axes[0].set_title("Throughput: deliveries per minute (UTC), one panel per direction")
    return fig


def open_figure(rows: Sequence[Mapping[str, Any]], duplicates: Sequence[Mapping[str, Any]] = ()) -> Any:
    """Obligations open (accepted, not yet ended) at the end of each minute, one line per direction
    (:func:`audit.transforms.open_over_time`; the listed duplicates' extra deliveries taken back): a backlog, a
    stall or a loss shows as a curve that does not return to zero."""
    from audit.transforms import open_over_time

    extra = [(d["last_delivered_at"].replace(second=0, microsecond=0), d["direction"], int(d["deliveries"]) - 1)
             for d in duplicates if d.get("last_delivered_at") is not None]
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title("Open obligations over time (accepted, not yet delivered or ended; end of each minute, UTC)")
    series = open_over_time(rows, extra)
    if not series:
        ax.text(0.5, 0.5, "no obligations", ha="center", transform=ax.transAxes)
        return fig
    for (direction, points), style in zip(sorted(series.items()), ("-", "--", ":", "-."), strict=False):
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.step(xs, ys, where="post", linestyle=style, marker="o" if len(xs) < 30 else None, label=direction)
    ax.set_ylabel("open obligations")
    ax.legend(loc="upper right")
    return fig


def _plot_latency(hist: list[dict[str, Any]], pct: list[dict[str, Any]]) -> bytes:
    fig = _figure()
    ax, bx = fig.subplots(1, 2)
    rows = sorted(hist, key=lambda r: r["lo_ms"])
    if rows:
        ax.bar([r["lo_ms"] for r in rows], [r["samples"] for r in rows],
               width=[r["hi_ms"] - r["lo_ms"] for r in rows], align="edge")
        ax.set_xscale("log")
        from matplotlib.ticker import NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title("End-to-end latency distribution")
    ax.set_xlabel("ms (log scale)")
    ax.set_ylabel("deliveries")
    hops = [r for r in pct if r["direction"] == "all"]
    names = [r["hop"] for r in hops]
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        bx.barh([f"{n} {label}" for n in names], [r[key] for r in hops], label=label)
    bx.set_title("Latency per hop (ms)")
    if hops:
        bx.legend()
    return _png(fig)


def _plot_faults(summ: dict[str, Any]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot()
    labels = ["lost", "duplicated", "re-sent at a takeover (allowed)", "stuck in doubt",
              *[f"dead letter: {k}" for k in sorted(summ["dead_letters"])]]
    values = [summ["lost"], summ["duplicated"], summ.get("resent", 0), summ["stuck_in_doubt"],
              *[summ["dead_letters"][k] for k in sorted(summ["dead_letters"])]]
    colors = ["#c0392b", "#d35400", "#2980b9", "#8e44ad", *["#7f8c8d"] * len(summ["dead_letters"])]
    bars = ax.barh(labels, values, color=colors)
    ax.bar_label(bars)
    ax.invert_yaxis()
    ax.set_title("Losses, duplicates, in doubt, dead letters (obligations)")
    return _png(fig)


# -------------------------------------------------------------------------------------------- HTML
def _table(rows: list[dict[str, Any]], limit: int = 200) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r[c]))}</td>" for c in cols) + "</tr>"
                   for r in rows[:limit])
    more = f"<p>… the first {limit} rows; all of them are in <code>tables/</code></p>" if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(_utc(v))


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def window_text(summ: dict[str, Any]) -> str:
    """The audited window as a person reads it: the bounds given (an open side says so, never "None") and the
    minutes that had deliveries, or that the window had none."""
    lo, hi = summ["window"]["from"], summ["window"]["to"]
    given = f"{lo or 'the first row'} .. {hi or 'the last row'}" if lo or hi else "the whole ledger"
    tp = summ.get("throughput") or {}
    if not summ["obligations"]:
        return f"{given}: no ledger rows in it"
    if tp.get("first_minute") is None:
        return f"{given}: no delivery in it"
    return f"{given}: deliveries from {tp['first_minute']} to {tp['last_minute']} (minutes, UTC)"


def _html(summ: dict[str, Any], frames: dict[str, list[dict[str, Any]]], plots: dict[str, bytes]) -> str:
    verdict = ("<p class=bad>VIOLATION: " + html.escape("; ".join(summ["violations"])) + "</p>"
               if summ["violations"] else "<p class=ok>No loss or duplicate beyond the allowed limits.</p>")
    facts = [{"what": k, "value": summ.get(k, 0)} for k in ("obligations", "lost", "duplicated", "resent",
                                                            "stuck_in_doubt", "as_of", "grace_s", "source", "master")]
    facts.append({"what": "window", "value": window_text(summ)})
    pct = sorted(_rows(frames["latency_percentiles"]), key=lambda r: (r["hop"], r["direction"] or ""))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nsjms audit</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1000px}} table{{border-collapse:collapse;margin:.5em 0}}
td,th{{border:1px solid #bbb;padding:2px 6px;font-size:90%}} .bad{{color:#fff;background:#c0392b;padding:.5em}}
.ok{{color:#fff;background:#27ae60;padding:.5em}} img{{max-width:100%}}</style></head><body>
<h1>nsjms delivery audit</h1>{verdict}
{_table(facts)}
<h2>Throughput</h2>{_img(plots["throughput"], "throughput per minute")}
<h2>Per bridge</h2><p>Obligations by status per direction and bridge (bridge <code>-</code>: the channel's own
CORBA consumers).</p>{_table(summ.get("by_bridge", []))}
<h2>Per node</h2><p>Obligations by status per node: the node that wrote the obligation's <code>accepted</code> row
(node <code>-</code>: none of its rows names a node, they predate the ledger's node column);
<code>multi_node</code>: those whose rows were written by more than one node.</p>{_table(summ.get("by_node", []))}
<h2>Open obligations</h2>{_img(plots["open"], "open obligations over time") if "open" in plots else ""}
<h2>Latency</h2>{_img(plots["latency"], "latency distribution")}{_table(pct)}
<h2>Losses and duplicates</h2>{_img(plots["faults"], "losses and duplicates")}
<h3>Lost</h3>{_table(_rows(frames["lost"]))}
<h3>Duplicated</h3><p>Obligations delivered more than once (violations; <code>nodes</code>: the nodes that wrote
the deliveries; every column in <code>tables/duplicates</code>).</p>{_table(_rows(_narrow(frames["duplicates"])))}
<h3>Re-sent at a takeover (allowed)</h3><p>Channel &rarr; JMS obligations delivered twice by one routing transaction
with one <code>nsjms_dedupe_id</code>: once by the node that died, once by the survivor that took its work over and
re-sent the messages whose broker commit was unknown (docs/cluster.md). The JMS consumer may see them more than
once, with the same dedupe id; not a violation.</p>{_table(_rows(_narrow(frames.get("resent", []))))}
<h3>Stuck in doubt</h3>{_table(_rows(frames["stuck_in_doubt"]))}
<h3>Dead letters by reason</h3>{_table(_rows(frames["dead_letters"]))}
<p>Generated {html.escape(summ["generated_at"])}; full tables in <code>tables/</code>, numbers in
<code>summary.json</code>.</p>
</body></html>
"""
