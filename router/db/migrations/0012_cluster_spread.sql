-- A dead node's work spread over the survivors (router/cluster/spread.py, docs/cluster.md "Takeover").
--
-- The survivor that fences a dead node assigns each of its channels (with its bridges) to a live member, least
-- loaded first, in the fence's transaction: the ownership rows move at once, and a channel assigned to another
-- survivor gets a row of nsjms_handoff with reason 'takeover' in state 'claimed' (owned by its new node, not to be
-- loaded yet). After the fencer (or whoever finishes the dead node's recovery) has finished the dead node's routing
-- transactions from PostgreSQL, the row becomes 'released' and its node loads the channel at its next period, as
-- it loads a hand-off ('started'). Reason 'join': a move requested for a node that has just joined (its share).
ALTER TABLE nsjms_handoff DROP CONSTRAINT nsjms_handoff_reason_check;
ALTER TABLE nsjms_handoff ADD CONSTRAINT nsjms_handoff_reason_check
    CHECK (reason IN ('drain', 'rebalance', 'placement', 'takeover', 'join'));
ALTER TABLE nsjms_handoff DROP CONSTRAINT nsjms_handoff_state_check;
ALTER TABLE nsjms_handoff ADD CONSTRAINT nsjms_handoff_state_check
    CHECK (state IN ('claimed', 'requested', 'released', 'started', 'failed'));
-- at most one open move per channel, a claimed one included
DROP INDEX nsjms_handoff_open;
CREATE UNIQUE INDEX nsjms_handoff_open ON nsjms_handoff (channel_id) WHERE state IN ('claimed', 'requested', 'released');
CREATE INDEX nsjms_handoff_claimed ON nsjms_handoff (from_node) WHERE state = 'claimed';
