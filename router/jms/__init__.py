"""JMS side of the bridge: the message model and the STOMP transport."""
