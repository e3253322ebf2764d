"""The operator's dead-letter tools (``nsjms deadletter``, the console's dead-letters pages), above the channel whose
store they read and below the node that serves them.

* :mod:`router.deadletter.ops`: list, show, retry, discard the channel's dead-letter store;
* :mod:`router.deadletter.admin`: ``NsjmsAdmin::DeadLetterAdmin``, the running node's servant over them;
* :mod:`router.deadletter.broker`: the same on the broker's dead-letter queues (``nsjms deadletter broker``), and
  :mod:`router.deadletter.broker_event`, a retry of an event a channel -> JMS bridge dead-lettered.

See docs/architecture.md.
"""
