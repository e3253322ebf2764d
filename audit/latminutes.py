"""The latency counts and the per-minute rows in ONE query (issue 28: one scan of the ledger, one shuffle).

:func:`audit.transforms.latency_counts` (per hop, direction and latency in whole µs, from the delivered rows) and
:func:`audit.transforms.minutes` (per minute, kind and dims, from the accepted and terminal rows) each read the
whole ledger and shuffle it once. :func:`counts_and_minutes` reads it once: every accepted or terminal row gives one
``minutes`` key (``h`` 0) and every delivered row also one key per hop it has (``h`` the hop's 1-based position in
:data:`audit.transforms.HOP_NAMES`), all in one struct shape, exploded and counted by one aggregation (every key a
primitive when the ledger's :class:`audit.transforms.Codes` are given). :func:`split` gives the driver both
collected tables from its rows: exactly the rows of the two transforms (the same keys counted the same way).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from audit import transforms as T

__all__ = ["counts_and_minutes", "split"]

_TS = ("accepted_at", "dispatched_at", "prepared_at", "decided_at", "broker_committed_at", "acknowledged_at")
_DIMS = ("direction", "channel_id", "bridge_id", "destination")
_TERMINAL = ("delivered", "dead_letter", "discarded", "expired")
_KINDS = ("accepted", "delivered", "ended")


def counts_and_minutes(ledger_df: DataFrame, codes: T.Codes | None = None) -> DataFrame:
    """h (0: a minutes row, else the hop), minute, k (the minutes kind: 1 accepted, 2 delivered, 3 ended),
    direction, channel_id, bridge_id, destination, v_us (a hop's latency), n. A minutes row has h 0, null v_us;
    a latency row has minute, k, channel_id, bridge_id and destination null."""
    outcome = F.col("outcome")
    delivered = outcome == "delivered"
    coded = {} if codes is None else {"direction": codes.direction, "destination": codes.destination}
    keys = {c: (T._encode(c, coded[c]) if c in coded else F.col(c)) for c in _DIMS}
    done = F.coalesce(*[F.col(c) for c in reversed(_TS)])
    minute = F.date_trunc("minute", F.when(outcome == "accepted", F.col("accepted_at")).otherwise(done))
    kind = F.when(outcome == "accepted", 1).when(delivered, 2).otherwise(3)
    us = _hop_us()
    null_ts, null_int = F.lit(None).cast("timestamp"), F.lit(None).cast("int")

    def entry(h: Any, m: Any, k: Any, ch: Any, br: Any, dest: Any, v: Any) -> Any:
        return F.struct(F.lit(h).alias("h"), m.alias("minute"), k.alias("k"), keys["direction"].alias("direction"),
                        ch.alias("channel_id"), br.alias("bridge_id"), dest.alias("destination"),
                        v.cast(LongType()).alias("v_us"))

    first = entry(0, minute, kind, F.when(delivered, keys["channel_id"]), F.when(delivered, keys["bridge_id"]),
                  F.when(delivered, keys["destination"]), F.lit(None))
    latency = [F.when(delivered & v.isNotNull(), entry(i + 1, null_ts, null_int, null_int, null_int,
                                                       F.lit(None).cast(_dest_type(codes)), v))
               for i, v in enumerate(us)]
    x = F.explode(F.array(first, *latency))
    cols = ["h", "minute", "k", "direction", "channel_id", "bridge_id", "destination", "v_us"]
    return (ledger_df.select(*_DIMS, *_TS, "outcome").where(outcome.isin("accepted", *_TERMINAL))
            .select(x.alias("x")).where(F.col("x").isNotNull())
            .select(*[F.col(f"x.{c}").alias(c) for c in cols])
            .groupBy(*cols).agg(F.count(F.lit(1)).alias("n"))
            .select(*cols, F.col("n").cast(LongType()).alias("n")))


def _dest_type(codes: T.Codes | None) -> str:
    """The type of the destination key: a string, or its code (``array_position``: a long)."""
    return "string" if codes is None else "bigint"


def _hop_us() -> list[Any]:
    """Each hop's latency in whole µs and end_to_end's, as :func:`audit.transforms.hop_micros` computes them."""
    out = []
    for _name, _, to in T.HOPS:
        earlier = _TS[:_TS.index(to)]
        out.append(T._us(F.coalesce(*[F.col(c) for c in reversed(earlier)]), F.col(to)))
    last = F.coalesce(*[F.col(c) for c in reversed(_TS[1:])])
    out.append(T._us(F.col("accepted_at"), last))
    return out


def split(table: Any, codes: T.Codes | None) -> tuple[T.CountColumns, list[dict[str, Any]]]:
    """Collected :func:`counts_and_minutes` rows (Arrow) → (:func:`audit.transforms.latency_counts` as
    :class:`audit.transforms.CountColumns`, :func:`audit.transforms.minutes` rows), decoded as those decode."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    def decode(values: list[Any], names: tuple[str, ...] | None) -> list[Any]:
        if names is None:
            return values
        return [None if v is None else names[int(v) - 1] for v in values]

    dirs = None if codes is None else codes.direction
    dests = None if codes is None else codes.destination
    is_min = pc.equal(table.column("h"), 0)
    lat, mins = table.filter(pc.invert(is_min)), table.filter(is_min)
    counts = T.CountColumns([T.HOP_NAMES[int(h) - 1] for h in lat.column("h").to_pylist()],
                            decode(lat.column("direction").to_pylist(), dirs),
                            [float(v) / 1000.0 for v in lat.column("v_us").to_pylist()],
                            lat.column("n").to_pylist())
    cols = {c: mins.column(c).to_pylist() for c in ("minute", "k", "direction", "channel_id", "bridge_id",
                                                    "destination", "n")}
    cols["direction"] = decode(cols["direction"], dirs)
    cols["destination"] = decode(cols["destination"], dests)
    rows = [{"minute": m, "direction": d, "kind": _KINDS[int(k) - 1], "channel_id": ch, "bridge_id": br,
             "destination": de, "rows": n}
            for m, k, d, ch, br, de, n in zip(cols["minute"], cols["k"], cols["direction"], cols["channel_id"],
                                               cols["bridge_id"], cols["destination"], cols["n"], strict=True)]
    return counts, rows
