"""nsjms router: the Extended Notification Service channel, the NS⇄JMS bridge and the ``nsjms`` CLI.

Nothing here has side effects at import; :mod:`router.node.server` builds a node from a configuration.
"""

__version__ = "0.1.0"
