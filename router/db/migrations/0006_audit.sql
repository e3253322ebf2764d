-- The incremental audit's bookkeeping (`nsjms audit --incremental`, audit/incremental.py, docs/audit.md).
--
-- nsjms_audit_day: one row per UTC day of the ledger (accepted_at) that an incremental audit reconciled. The day is
-- audited again when its fingerprint (row count, max(entry_id), the counts of the nullable columns and the sums of
-- the hop times: a late row and a column filled in later both change it) or the grace differs from the one stored
-- here, or when recheck_at has passed: the earliest time an obligation still open at the audit (in flight within
-- the grace, or in doubt) can change its status with no row written (turn lost, or stuck in doubt). So an obligation
-- accepted before midnight and delivered after it is carried as open, never reported lost at the day's end.
-- figures: the day's counts per (direction, bridge_id, node, status) with the oldest open obligation, and the ids
-- of up to 100 lost and 100 duplicated obligations. Written only by the audit; the router never reads it.
CREATE TABLE nsjms_audit_day (
    day         date             PRIMARY KEY,
    fingerprint text             NOT NULL,
    grace_s     double precision NOT NULL,
    as_of       timestamptz      NOT NULL,
    audited_at  timestamptz      NOT NULL DEFAULT clock_timestamp(),
    verdict     text             NOT NULL CHECK (verdict IN ('pass', 'open', 'fail')),
    recheck_at  timestamptz,
    figures     jsonb            NOT NULL
);
