-- The routing transaction T2 (docs/transactions.md): the outbox (channel -> JMS) and the inbox (JMS -> channel).
--
-- nsjms_outbox: one row per message a T2 sends to the broker, written in the T2's PostgreSQL branch, with the
-- STOMP frame exactly as sent (headers + body) and its deterministic dedupe id. Recovery re-sends the rows of a
-- transaction whose decision is COMMIT and whose broker commit is not known to have happened, with the same
-- dedupe ids. Rows of ended transactions are deleted (in batches, and at start).
CREATE TABLE nsjms_outbox (
    gtrid       text        NOT NULL,
    idx         integer     NOT NULL,
    dedupe_id   text        NOT NULL,
    bridge_id   integer     NOT NULL,
    destination text        NOT NULL,
    headers     jsonb       NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gtrid, idx)
);

-- nsjms_inbox: the broker message id of every message a JMS -> channel T2 turned into an event, unique per
-- bridge, written in the same branch as the event. A redelivery (lost ack, crash before the broker commit)
-- finds its id here and is acknowledged without a second event. Rows older than the retention are deleted.
CREATE TABLE nsjms_inbox (
    bridge_id   integer     NOT NULL,
    message_id  text        NOT NULL,
    gtrid       text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bridge_id, message_id)
);
CREATE INDEX nsjms_inbox_received ON nsjms_inbox (received_at);
