-- The channel's dead-letter store (docs/channel.md, "Dead letters"; router/channel/deadletters.py).
--
-- An event the channel gives up on for one consumer (its content failed alone POISON_ATTEMPTS times: MARSHAL,
-- IMP_LIMIT, BAD_PARAM, DATA_CONVERSION, a conversion error in the channel) or a pulled event the channel refuses
-- (unusable QoS headers, above node.max_event_bytes) moves here with its reason, in the SAME transaction that
-- removes it from the proxy's queue: it is never in neither place. An operator lists, shows, retries (back into the
-- proxy's queue, or the channel's if the proxy is gone) and discards rows with `nsjms deadletter`.
--
-- side 'C': a proxy supplier gave up delivering it (admin_id/proxy_id: the consumer admin and proxy supplier);
-- side 'S': a proxy consumer pulled it and the channel refused it (the supplier admin and proxy consumer).
-- dedupe_id: the ledger obligation it ended (e<event>/c/a/p, or b<run>/s<seq>/c/a/p for a BestEffort event;
-- p<run>/s<seq>/c/a/p for a refused pulled event, which has no ledger rows), unique, so a unit of work retried
-- after a lost COMMIT reply never stores a dead letter twice.
-- body: the event's CDR encapsulation as the queue stored it (router.channel.events.encode/decode); NULL only when
-- the channel could not encode it at all (reason says so).
CREATE TABLE nsjms_dead_letter (
    id            bigserial   PRIMARY KEY,
    dedupe_id     text        NOT NULL UNIQUE,
    channel_id    integer     NOT NULL,
    side          char(1)     NOT NULL CHECK (side IN ('C', 'S')),
    admin_id      integer     NOT NULL,
    proxy_id      integer     NOT NULL,
    event_id      bigint,
    seq           bigint      NOT NULL,
    form          smallint    NOT NULL,
    body          bytea,
    priority      integer     NOT NULL,
    deadline      double precision,
    start_at      double precision,
    persistent    boolean     NOT NULL,
    event_name    text        NOT NULL,
    reason        text        NOT NULL,
    exception     text        NOT NULL,
    attempts      integer     NOT NULL,
    received_at   timestamptz NOT NULL,
    dead_at       timestamptz NOT NULL,
    retries       integer     NOT NULL DEFAULT 0
);
CREATE INDEX nsjms_dead_letter_channel ON nsjms_dead_letter(channel_id, id);
