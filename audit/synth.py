"""A deterministic synthetic delivery ledger with injected faults.

:func:`generate` builds ``deliveries`` delivery obligations (one ``accepted`` row each plus, unless a fault
says otherwise, one ``delivered`` row with every hop timestamp) as a pyarrow table, and the exact set of
faults it injected (:class:`Truth`): lost (accepted, no later row), duplicated (a second ``delivered`` row),
stuck in doubt (an ``in_doubt`` row, no decision) and dead-lettered (a ``dead_letter`` row with a reason).
The same spec and seed give the same table, byte for byte.

Hop latencies are log-normal (median / spread per hop in :data:`HOPS`), so percentiles have realistic tails.
Writers: :func:`write_parquet` (Parquet by day, the layout ``nsjms ledger export`` produces) and
:func:`copy_to_postgres` (``COPY … FROM STDIN``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.csv as pacsv  # type: ignore[import-untyped]
import pyarrow.dataset as pads  # type: ignore[import-untyped]
from psycopg import sql

from audit import UsageError
from audit.ledger import COLUMNS, TABLE, Outcome

__all__ = [
    "DEAD_LETTER_REASONS",
    "HOPS",
    "SURVIVOR",
    "SynthSpec",
    "Truth",
    "arrow_schema",
    "copy_to_postgres",
    "generate",
    "write_parquet",
]

#: Median (µs) and log-normal sigma of each hop, from the previous hop.
HOPS: tuple[tuple[str, float, float], ...] = (
    ("dispatched_at", 1_500.0, 0.6),
    ("prepared_at", 2_500.0, 0.5),
    ("decided_at", 800.0, 0.4),
    ("broker_committed_at", 3_000.0, 0.7),
    ("acknowledged_at", 1_200.0, 0.5),
)
DEAD_LETTER_REASONS: tuple[str, ...] = ("mapping failed", "header too large", "max redeliveries", "no such destination")
_TS = pa.timestamp("us", tz="UTC")
#: The node that writes the takeover rows of :attr:`SynthSpec.resent` and :attr:`SynthSpec.cross_node_duplicates`.
SURVIVOR = "survivor"


def arrow_schema() -> pa.Schema:
    """The ledger as Arrow: the column names and types of ``nsjms_ledger``, plus nothing else."""
    types: dict[str, pa.DataType] = {
        "entry_id": pa.int64(), "event_id": pa.int64(), "channel_id": pa.int32(), "proxy_id": pa.int32(),
        "bridge_id": pa.int32(),
    }
    return pa.schema([pa.field(c, _TS if c.endswith("_at") else types.get(c, pa.string())) for c in COLUMNS])


@dataclass(frozen=True)
class SynthSpec:
    """``deliveries`` obligations accepted at ``rate_per_s`` from ``start``; fault counts are exact."""

    deliveries: int
    seed: int = 1
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    rate_per_s: float = 500.0
    channels: int = 3
    bridges: int = 6
    destinations: int = 4
    jms_to_channel_share: float = 0.3
    nodes: int = 1                      # bridge b's rows are written by node ``node<b % nodes + 1>``
    lost: int = 0
    duplicates: int = 0
    in_doubt: int = 0
    dead_letters: int = 0
    #: channel → JMS obligations re-sent at a takeover (docs/cluster.md): their delivered row's gtrid names the
    #: node that wrote it (``node:…``), and the survivor (node :data:`SURVIVOR`) wrote a second ``delivered`` row of
    #: the same transaction and message, as ``router.routing.ledger_takeover.record_resends`` does: expected, not a
    #: violation
    resent: int = 0
    #: channel → JMS obligations delivered a second time by :data:`SURVIVOR` in a transaction of its own (another
    #: gtrid): a duplicate across nodes that the takeover's rules do not allow (counted in ``Truth.duplicated``)
    cross_node_duplicates: int = 0

    def __post_init__(self) -> None:
        faults = (self.lost + self.duplicates + self.in_doubt + self.dead_letters + self.resent
                  + self.cross_node_duplicates)
        if self.deliveries < 1 or self.nodes < 1 or min(self.lost, self.duplicates, self.in_doubt,
                                                         self.dead_letters, self.resent,
                                                         self.cross_node_duplicates) < 0:
            raise UsageError("deliveries must be >= 1 and fault counts >= 0")
        if faults > self.deliveries:
            raise UsageError(f"{faults} injected faults need at least as many deliveries, got {self.deliveries}")
        if self.rate_per_s <= 0 or self.start.tzinfo is None:
            raise UsageError("rate_per_s must be > 0 and start timezone-aware")


@dataclass(frozen=True)
class Truth:
    """The dedupe ids of the injected faults (and, for in-doubt, the gtrids)."""

    lost: frozenset[str] = field(default_factory=frozenset)
    duplicated: frozenset[str] = field(default_factory=frozenset)
    in_doubt: frozenset[str] = field(default_factory=frozenset)
    in_doubt_gtrids: frozenset[str] = field(default_factory=frozenset)
    dead_letters: dict[str, int] = field(default_factory=dict)
    resent: frozenset[str] = field(default_factory=frozenset)


def generate(spec: SynthSpec) -> tuple[pa.Table, Truth]:
    """The synthetic ledger (rows ordered by ``accepted_at``) and what was injected."""
    rng = np.random.default_rng(spec.seed)
    n = spec.deliveries
    base = _base(spec, rng)
    hops = _hops(base["accepted_at"], n, rng)
    picks = rng.permutation(n)
    cut = np.cumsum([spec.lost, spec.duplicates, spec.in_doubt, spec.dead_letters])
    lost, dup, doubt, dead = np.split(picks[: cut[-1]], cut[:-1])
    reasons = rng.integers(0, len(DEAD_LETTER_REASONS), size=len(dead))
    delivered = np.ones(n, dtype=bool)
    delivered[np.concatenate([lost, doubt, dead])] = False
    resent, cross = _takeover_picks(spec, base, delivered, dup)
    parts = [
        _rows(base, {}, np.arange(n), Outcome.ACCEPTED),
        _rows(base, hops, np.flatnonzero(delivered), Outcome.DELIVERED),
        _rows(base, hops, np.sort(dup), Outcome.DELIVERED),
        _rows(base, {"dispatched_at": hops["dispatched_at"], "prepared_at": hops["prepared_at"]}, doubt,
              Outcome.IN_DOUBT),
        _rows(base, {"dispatched_at": hops["dispatched_at"]}, dead, Outcome.DEAD_LETTER,
              reasons=np.array(DEAD_LETTER_REASONS, dtype=object)[reasons]),
    ]
    if len(resent) or len(cross):
        parts += _takeover_rows(base, hops, resent, cross)
    table = pa.concat_tables(parts)
    table = table.take(pc.sort_indices(table, [("accepted_at", "ascending"), ("recorded_at", "ascending")]))
    table = table.set_column(0, "entry_id", pa.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
    def ids(which: np.ndarray[Any, Any], column: str = "dedupe_id") -> frozenset[str]:
        return frozenset(base[column].take(pa.array(which, type=pa.int64())).to_pylist())

    truth = Truth(
        lost=ids(lost), duplicated=ids(np.concatenate([dup, cross])), resent=ids(resent), in_doubt=ids(doubt),
        in_doubt_gtrids=ids(doubt, "gtrid"),
        dead_letters={r: int((reasons == i).sum()) for i, r in enumerate(DEAD_LETTER_REASONS) if (reasons == i).any()},
    )
    return table.cast(arrow_schema()), truth


def _base(spec: SynthSpec, rng: np.random.Generator) -> dict[str, Any]:
    """Per-obligation columns: numpy arrays for numbers, pyarrow arrays for strings (fast to build)."""
    n = spec.deliveries
    start_us = int(spec.start.timestamp() * 1_000_000)
    step = 1_000_000.0 / spec.rate_per_s
    accepted = start_us + (np.arange(n) * step + rng.uniform(0, step, n)).astype(np.int64)
    j2c = rng.random(n) < spec.jms_to_channel_share
    bridge = rng.integers(0, spec.bridges, n).astype(np.int32)
    num = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    destinations = pa.array([f"queue/orders.{d}" for d in range(spec.destinations)])
    return {
        "accepted_at": accepted,
        "event_id": np.arange(1, n + 1, dtype=np.int64),
        "jms_message_id": pc.binary_join_element_wise("ID:synth-", num, ""),
        "dedupe_id": pc.binary_join_element_wise(pc.if_else(pa.array(j2c), "j2c-", "c2j-"), num, ""),
        "channel_id": (bridge % spec.channels).astype(np.int32),
        "proxy_id": bridge,
        "bridge_id": bridge,
        "destination": destinations.take(pa.array(bridge % spec.destinations)),
        "direction": pc.if_else(pa.array(j2c), "jms_to_channel", "channel_to_jms"),
        "gtrid": pc.binary_join_element_wise("nsjms-synth-", num, ""),
        "node_id": pa.array([f"node{i + 1}" for i in range(spec.nodes)]).take(pa.array(bridge % spec.nodes)),
    }


def _takeover_picks(spec: SynthSpec, base: dict[str, Any], delivered: np.ndarray[Any, Any],
                    dup: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The obligations of :attr:`SynthSpec.resent` and :attr:`SynthSpec.cross_node_duplicates`: delivered channel →
    JMS ones not duplicated already, from a random stream of their own (a spec without them gives the same ledger
    as before they existed). The re-sent ones' gtrid gets their node's name (``node:…``), as a T2's has."""
    want = spec.resent + spec.cross_node_duplicates
    none = np.zeros(0, dtype=np.int64)
    if not want:
        return none, none
    free = delivered.copy()
    free[dup] = False
    free &= np.asarray(pc.equal(base["direction"], "channel_to_jms").to_numpy(zero_copy_only=False), dtype=bool)
    candidates = np.flatnonzero(free)
    if len(candidates) < want:
        raise UsageError(f"{want} takeover faults need as many delivered channel → JMS obligations, "
                         f"got {len(candidates)}")
    picks = np.random.default_rng([spec.seed, 28]).permutation(candidates)[:want]
    resent, cross = np.sort(picks[: spec.resent]), np.sort(picks[spec.resent:])
    mark = np.zeros(len(delivered), dtype=bool)
    mark[resent] = True
    base["gtrid"] = pc.if_else(pa.array(mark), pc.binary_join_element_wise(base["node_id"], base["gtrid"], ":"),
                               base["gtrid"])
    return resent, cross


def _takeover_rows(base: dict[str, Any], hops: dict[str, np.ndarray[Any, Any]], resent: np.ndarray[Any, Any],
                   cross: np.ndarray[Any, Any]) -> list[pa.Table]:
    """The survivor's second ``delivered`` rows: a re-send (same gtrid and message, broker commit 30 s later, no
    acknowledgement) and a delivery in a transaction of its own (gtrid ``survivor:…``)."""
    later = {**hops, "broker_committed_at": hops["broker_committed_at"] + 30_000_000}
    out = []
    for idx, own in ((resent, False), (cross, True)):
        if not len(idx):
            continue
        t = _rows(base, {k: v for k, v in later.items() if k != "acknowledged_at"}, idx, Outcome.DELIVERED)
        t = t.set_column(t.schema.get_field_index("node_id"), "node_id", pa.array([SURVIVOR] * len(idx), pa.string()))
        if own:
            gtrid = pc.binary_join_element_wise(f"{SURVIVOR}:", t["gtrid"], "")
            t = t.set_column(t.schema.get_field_index("gtrid"), "gtrid", gtrid.cast(pa.string()))
        out.append(t)
    return out


def _hops(accepted: np.ndarray[Any, Any], n: int, rng: np.random.Generator) -> dict[str, np.ndarray[Any, Any]]:
    out, t = {}, accepted
    for name, median, sigma in HOPS:
        t = t + rng.lognormal(np.log(median), sigma, n).astype(np.int64)
        out[name] = t
    return out


def _rows(base: dict[str, Any], hops: dict[str, np.ndarray[Any, Any]], idx: np.ndarray[Any, Any],
          outcome: Outcome, reasons: np.ndarray[Any, Any] | None = None) -> pa.Table:
    m = len(idx)
    cols: dict[str, pa.Array] = {}
    last = base["accepted_at"][idx]
    for c in COLUMNS:
        if c in base:
            v = base[c]
            cols[c] = v.take(pa.array(idx)) if isinstance(v, pa.Array) else pa.array(v[idx])
        elif c in hops:
            cols[c] = pa.array(hops[c][idx], type=pa.int64())
            last = np.maximum(last, hops[c][idx])
        elif c == "outcome":
            cols[c] = pa.array([outcome.value] * m, type=pa.string())
        elif c == "failure_reason" and reasons is not None:
            cols[c] = pa.array(reasons, type=pa.string())
        elif c.endswith("_at"):
            cols[c] = pa.nulls(m, pa.int64())
        else:
            cols[c] = pa.nulls(m, pa.int64() if c == "entry_id" else pa.string())
    cols["recorded_at"] = pa.array(last if outcome is not Outcome.ACCEPTED else base["accepted_at"][idx] + 1)
    cols["gtrid"] = cols["gtrid"] if outcome is not Outcome.ACCEPTED else pa.nulls(m, pa.string())
    schema = arrow_schema()
    return pa.table({c: cols[c].cast(schema.field(c).type) for c in COLUMNS})


def write_parquet(table: pa.Table, out: Path) -> list[Path]:
    """Write ``out/day=YYYY-MM-DD/part-0.parquet`` (UTC days of ``accepted_at``); return the files."""
    day = pc.strftime(table["accepted_at"], format="%Y-%m-%d")
    pads.write_dataset(table.append_column("day", day), out, format="parquet",
                       partitioning=pads.partitioning(pa.schema([("day", pa.string())]), flavor="hive"),
                       existing_data_behavior="delete_matching", basename_template="part-{i}.parquet")
    return sorted(out.glob("day=*/*.parquet"))


def copy_to_postgres(table: pa.Table, conn: Any, batch_rows: int = 200_000) -> int:
    """``COPY`` the rows into ``nsjms_ledger`` (``entry_id`` renumbered by PostgreSQL); return the row count."""
    cols = [c for c in COLUMNS if c != "entry_id"]
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(TABLE), sql.SQL(", ").join(map(sql.Identifier, cols)))
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        for batch in table.select(cols).to_batches(max_chunksize=batch_rows):
            buf = io.BytesIO()
            pacsv.write_csv(pa.Table.from_batches([batch]), buf, options)
            copy.write(buf.getvalue())
    return int(table.num_rows)
