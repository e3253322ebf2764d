-- The outbox stores an encoded message with its codec's name, not a STOMP frame (issue 24; docs/transactions.md).
--
-- nsjms_outbox.codec: the MessageCodec.name of the codec that encoded the row's headers and body (the node's STOMP
-- codec is 'stomp-activemq', router/mapping/stomp_codec.py). Recovery re-sends a row through the codec it names:
-- the stored encoding as it is when the broker connection encodes with that codec, else decoded by it and sent as
-- the message; a row whose codec the node does not have is dead-lettered with the reason, never dropped
-- (router.t2.OutboxResender). Rows written before this migration were all encoded by the STOMP codec: the default
-- names it, so they still re-send with the same bytes and dedupe ids. A constant default is a catalog change in
-- PostgreSQL 11 and later (no table rewrite).
ALTER TABLE nsjms_outbox ADD COLUMN codec text NOT NULL DEFAULT 'stomp-activemq';
