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
-- Existing rows are kept: they move to the default partition with sent_day 1970-01-01 (their timestamp is not
-- known), and router.t2.inbox_claim also looks for such a legacy row, so a message received before this
-- migration and redelivered after it is still recognised.
ALTER TABLE nsjms_inbox RENAME TO nsjms_inbox_0002;
ALTER TABLE nsjms_inbox_0002 RENAME CONSTRAINT nsjms_inbox_pkey TO nsjms_inbox_0002_pkey;
ALTER INDEX nsjms_inbox_received RENAME TO nsjms_inbox_0002_received;

CREATE TABLE nsjms_inbox (
    bridge_id   integer     NOT NULL,
    message_id  text        NOT NULL,
    gtrid       text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    sent_day    date        NOT NULL DEFAULT DATE '1970-01-01',
    PRIMARY KEY (bridge_id, message_id, sent_day)
) PARTITION BY RANGE (sent_day);
CREATE INDEX nsjms_inbox_received ON nsjms_inbox (received_at);
CREATE TABLE nsjms_inbox_default PARTITION OF nsjms_inbox DEFAULT;

INSERT INTO nsjms_inbox (bridge_id, message_id, gtrid, received_at)
    SELECT bridge_id, message_id, gtrid, received_at FROM nsjms_inbox_0002;
DROP TABLE nsjms_inbox_0002;
