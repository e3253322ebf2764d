-- The cluster's membership, leases and fencing (router/cluster, docs/cluster.md).
--
-- nsjms_member: one row per node id. A node holds a lease it renews (lease_until, from PostgreSQL's clock: one clock
-- for every node) and an epoch, its fencing token. A survivor that takes a dead node's work over bumps that node's
-- epoch and marks it 'fenced' in one transaction; every ownership-dependent write of a node checks its (node_id,
-- epoch) with FOR KEY SHARE in its own transaction, which the takeover's FOR UPDATE waits for: a paused node that
-- wakes after a takeover can commit nothing that depends on what it owned.
CREATE TABLE nsjms_member (
    node_id     text        PRIMARY KEY CHECK (node_id ~ '^[A-Za-z0-9_-]{1,32}$'),
    epoch       bigint      NOT NULL CHECK (epoch >= 1),
    state       text        NOT NULL CHECK (state IN ('live', 'fenced', 'left')),
    address     text        NOT NULL DEFAULT '',
    incarnation text        NOT NULL DEFAULT '',   -- a random token of the process that joined (router/cluster/node.py)
    lease_until timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    joined_at   timestamptz NOT NULL,
    fenced_by   text,
    fenced_at   timestamptz
);

-- nsjms_owner: which node owns each channel and each bridge (sticky: a row changes only on a claim of a dead or
-- left node's work, or a hand-over).
CREATE TABLE nsjms_owner (
    kind        text        NOT NULL CHECK (kind IN ('channel', 'bridge')),
    object_id   integer     NOT NULL,
    node_id     text        NOT NULL,
    since       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, object_id)
);
CREATE INDEX nsjms_owner_node ON nsjms_owner (node_id);
