-- 0005: nsjms_inbox partitioned by day (issue 31: one row per JMS -> channel message for the retention, 7 days:
-- about 44 M rows and 10 GB at 73 msg/s, purged by DELETE). docs/transactions.md "The inbox" explains it.
--
-- The partition key is sent_day, the UTC day of the message's JMSTimestamp (the broker's `timestamp` header),
-- NOT the day it was received: a redelivery carries the same JMSTimestamp, so it always maps to the same
-- partition as its first delivery, and the primary key (bridge_id, message_id, sent_day) - PostgreSQL requires
-- the partition key in a unique key of a partitioned table - is exactly "this message id, once per bridge",
-- also across midnight and also for a redelivery racing its first delivery's transaction (the same unique index
-- makes the second insert wait for the first's outcome, as before).
-- A message without a timestamp (JMSTimestamp 0: the producer disabled it) gets sent_day 1970-01-01.
-- Day partitions are created ahead and dropped by router/db/inbox.py (rows still inside the retention by
-- received_at are moved to the default partition first); rows of a day without a partition (no timestamp, a
-- timestamp older than the partitions kept or far in the future) live in the default partition, purged by
-- received_at as before.
--
-- Existing rows are kept without copying them: the old table becomes the default partition (sent_day 1970-01-01
-- for every row, a constant default PostgreSQL adds without rewriting the table; only its primary key is rebuilt
-- to include sent_day). router.t2.inbox_claim also looks for such a 1970-01-01 row, so a message received before
-- this migration and redelivered after it (now with its timestamp) is still recognised.
ALTER TABLE nsjms_inbox RENAME TO nsjms_inbox_default;
ALTER TABLE nsjms_inbox_default ADD COLUMN sent_day date NOT NULL DEFAULT DATE '1970-01-01';
ALTER TABLE nsjms_inbox_default DROP CONSTRAINT nsjms_inbox_pkey;
ALTER TABLE nsjms_inbox_default ADD CONSTRAINT nsjms_inbox_default_pkey PRIMARY KEY (bridge_id, message_id, sent_day);
ALTER INDEX nsjms_inbox_received RENAME TO nsjms_inbox_default_received_at_idx;

CREATE TABLE nsjms_inbox (
    bridge_id   integer     NOT NULL,
    message_id  text        NOT NULL,
    gtrid       text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    sent_day    date        NOT NULL DEFAULT DATE '1970-01-01',
    PRIMARY KEY (bridge_id, message_id, sent_day)
) PARTITION BY RANGE (sent_day);
CREATE INDEX nsjms_inbox_received ON nsjms_inbox (received_at);
ALTER TABLE nsjms_inbox ATTACH PARTITION nsjms_inbox_default DEFAULT;
