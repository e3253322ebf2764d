-- The node that wrote each ledger row (router/ledger.py fills it from node.node_id; docs/audit.md, "Nodes").
--
-- NULL: a row written before this migration, or by a writer that was given no node id (unknown). Adding a nullable
-- column without a default is a catalogue change only: no partition is rewritten. No CHECK: the writer's node id is
-- already validated by the configuration (router/config.py, the same pattern as nsjms_member.node_id), and a CHECK
-- on the partitioned table would scan every partition when this migration runs.
ALTER TABLE nsjms_ledger ADD COLUMN node_id text;
