-- Drain-and-handoff of channels (with their bridges) between live members (router/cluster/handoff.py,
-- docs/cluster.md "Placement and operations").
--
-- nsjms_handoff: one row per requested move of a channel (and its bridges, which follow it). An operator's
-- `nsjms cluster drain|rebalance` (or a node's least-loaded placement of a channel it just created) inserts it as
-- 'requested'; the owning node, at its next renewal period, finishes the routing transactions in flight on the
-- channel, stops it and its bridges and, in ONE transaction fenced by its epoch, moves their ownership rows to
-- to_node and marks the row 'released'; to_node, at its next period, loads them from PostgreSQL and starts them
-- ('started'). A request made for an incarnation that is gone (from_epoch is not the node's epoch any more) is
-- never acted on by a later one. 'failed': the move could not be done (error says why); the channel stays where
-- it was.
CREATE TABLE nsjms_handoff (
    id           bigserial   PRIMARY KEY,
    channel_id   integer     NOT NULL,
    from_node    text        NOT NULL,
    from_epoch   bigint      NOT NULL,
    to_node      text        NOT NULL,
    reason       text        NOT NULL CHECK (reason IN ('drain', 'rebalance', 'placement')),
    state        text        NOT NULL DEFAULT 'requested'
                             CHECK (state IN ('requested', 'released', 'started', 'failed')),
    bridges      integer[]   NOT NULL DEFAULT '{}',
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    released_at  timestamptz,
    started_at   timestamptz,
    stop_s       double precision,      -- how long the old owner took to stop the channel and its bridges
    error        text
);
-- at most one open move per channel
CREATE UNIQUE INDEX nsjms_handoff_open ON nsjms_handoff (channel_id) WHERE state IN ('requested', 'released');
CREATE INDEX nsjms_handoff_from ON nsjms_handoff (from_node) WHERE state = 'requested';
CREATE INDEX nsjms_handoff_to ON nsjms_handoff (to_node) WHERE state = 'released';

-- nsjms_drain: a member being drained (this incarnation: epoch). It gets no new channel from placement or
-- rebalance; a restart (a new epoch) ends it. The node writes its routing transactions still in doubt (from its own
-- recovery log, which only it can read) into in_doubt at every renewal period while it is drained, so that
-- `nsjms cluster drain` can say clean / dirty / heuristic from any machine.
CREATE TABLE nsjms_drain (
    node_id      text        PRIMARY KEY,
    epoch        bigint      NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    in_doubt     jsonb,
    reported_at  timestamptz
);
