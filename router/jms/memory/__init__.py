"""An in-process twin of a STOMP/JMS broker and a :class:`~router.jms.transport.Transport` for it (``memory://NAME``).

It behaves like ActiveMQ Classic over STOMP where the contract tests pin it down: messages go through the same
codec as on the wire (so properties arrive as String headers), queues and topics, durable subscriptions,
transactions (sends and acks applied at COMMIT; after ABORT the acked deliveries must be acked again), auto /
client / client-individual acks, redelivery (``redelivered: true``) of un-acked messages on unsubscribe, close and
broker restart, NACK to a dead-letter list, JMS selectors (comparisons, AND/OR/NOT, IN, LIKE, BETWEEN, IS NULL, with
ActiveMQ's String-to-number/boolean conversion; no arithmetic), and ERROR answers (a bad selector is a
:class:`~router.jms.errors.BrokerError`).

It fails loudly: misuse raises :class:`~router.jms.errors.LocalProtocolError` exactly as the STOMP transport does
(both use :class:`~router.jms.session.SessionBook`), and ``MemoryBroker.inject_fault`` makes the next matching
operation fail with a chosen error so callers' failure paths can be unit-tested. Delivery delay
(``AMQ_SCHEDULED_DELAY``) is not simulated.

Modules: ``transport`` (:class:`~router.jms.memory.transport.MemoryTransport`), ``broker``
(:class:`~router.jms.memory.broker.MemoryBroker`: queues, topics, subscriptions, outages, injected faults) and
``matcher`` (JMS selectors compiled to predicates over a message's headers).
"""
