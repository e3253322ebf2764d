-- 0002: the delivery ledger (router/ledger.py writes it, audit/ reads it; docs/audit.md).
--
-- Append-only. One delivery obligation (one event for one consumer proxy, or one JMS message for one
-- bridge) is identified by dedupe_id; every row of it carries the same dedupe_id and the same accepted_at,
-- so a day partition holds whole obligations and retention never splits one.
-- Rows: one 'accepted' row when nsjms takes responsibility, then one row per later step:
-- 'in_doubt' (T2 prepared, decision pending), 'rolled_back' (T2 rolled back; the item is retried),
-- and one terminal row: 'delivered', 'dead_letter', 'discarded' or 'expired'.
CREATE TABLE nsjms_ledger (
    entry_id            bigint      GENERATED ALWAYS AS IDENTITY,
    event_id            bigint,
    jms_message_id      text,
    dedupe_id           text        NOT NULL,
    channel_id          integer     NOT NULL,
    proxy_id            integer,
    bridge_id           integer,
    destination         text,
    direction           text        NOT NULL
        CHECK (direction IN ('channel_to_jms', 'jms_to_channel', 'channel_to_consumer')),
    gtrid               text,
    accepted_at         timestamptz NOT NULL,
    dispatched_at       timestamptz,
    prepared_at         timestamptz,
    decided_at          timestamptz,
    broker_committed_at timestamptz,
    acknowledged_at     timestamptz,
    outcome             text        NOT NULL
        CHECK (outcome IN ('accepted', 'in_doubt', 'rolled_back', 'delivered', 'dead_letter', 'discarded', 'expired')),
    failure_reason      text,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT nsjms_ledger_reason CHECK (
        (outcome IN ('rolled_back', 'dead_letter', 'discarded', 'expired')) = (failure_reason IS NOT NULL)),
    PRIMARY KEY (accepted_at, entry_id)
) PARTITION BY RANGE (accepted_at);

CREATE INDEX nsjms_ledger_dedupe ON nsjms_ledger (dedupe_id);
CREATE INDEX nsjms_ledger_gtrid ON nsjms_ledger (gtrid) WHERE gtrid IS NOT NULL;

-- Rows whose day has no partition yet land here instead of failing the routing transaction;
-- router.ledger.ensure_partitions() moves them into their day partition when it creates it.
CREATE TABLE nsjms_ledger_default PARTITION OF nsjms_ledger DEFAULT;
