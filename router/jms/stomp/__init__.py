"""The STOMP 1.2 implementation of the broker transport (stomp.py 9), for ActiveMQ Classic and other STOMP brokers.

Modules: ``transport`` (:class:`~router.jms.stomp.transport.StompTransport`, the Transport operations as frames),
``connection`` (the connection's lifecycle across epochs, frames out with receipts, the dispatcher of frames in),
``receipts`` (waiting for the broker's answers), ``inbound`` (the receiver-thread listener, split-frame reassembly),
``link`` (the URL, the socket's ``TCP_NODELAY`` and chunked writes), ``sendframe`` (SEND/ACK frame encoding, byte for
byte stomp.py's) and ``readframe`` (frame parsing, as stomp.py's). stomp.py's exceptions end in this package.
"""
