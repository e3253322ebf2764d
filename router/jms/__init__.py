"""JMS side of the bridge: the broker seam and its two implementations.

The seam: :mod:`~router.jms.transport` (the ``Transport`` protocol, the values crossing it, the URL-scheme table),
:mod:`~router.jms.errors` (what a transport raises), :mod:`~router.jms.model` (the JMS message model),
:mod:`~router.jms.refusal` (which broker refusals are resource outages), :mod:`~router.jms.selector` (JMS selector
syntax). Shared by the implementations: :mod:`~router.jms.session` (client-side session state),
:mod:`~router.jms.retry` (the reconnect policy), :mod:`~router.jms.codec` (the default codec). The implementations:
:mod:`router.jms.stomp` (STOMP 1.2 over stomp.py) and :mod:`router.jms.memory` (the in-memory twin).
"""
