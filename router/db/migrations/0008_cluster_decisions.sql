-- The routing transaction's decisions where every node can read them (router/cluster/decisions.py,
-- docs/cluster.md).
--
-- nsjms_decision: one row per T2 its coordinator decided to COMMIT, written in the decision step BEFORE the node's
-- file log gets the COMMIT record, in a short transaction of its own that checks the coordinator's epoch (the fence
-- check, FOR KEY SHARE on its nsjms_member row): once a survivor has fenced a node, that node can write no new
-- decision, so the survivor reads the complete set of the dead node's decisions here, without its disk, commits
-- their prepared branches, re-sends their outbox rows with the same dedupe ids, and rolls back every other prepared
-- branch of that node (presumed abort). Rows of ended transactions are deleted in the node's next decision write.
CREATE TABLE nsjms_decision (
    gtrid        text        PRIMARY KEY,
    node_id      text        NOT NULL,
    epoch        bigint      NOT NULL,
    participants jsonb       NOT NULL,
    decided_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX nsjms_decision_node ON nsjms_decision (node_id);
