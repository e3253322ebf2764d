"""The persistent CORBA Notification Service event channel (OMG NS 1.1 chapters 2-3).

Modules: :mod:`~router.channel.channel` (factory, channel, routing), :mod:`~router.channel.admins`,
:mod:`~router.channel.proxies` (proxy suppliers: the servant classes; their code in
:mod:`~router.channel.proxybase`, :mod:`~router.channel.pushsupplier`, :mod:`~router.channel.pullsupplier`),
:mod:`~router.channel.consumers` (proxy consumers),
:mod:`~router.channel.qos` (QoS and admin properties), :mod:`~router.channel.queue` (per-consumer queues),
:mod:`~router.channel.store` (PostgreSQL), :mod:`~router.channel.events` (event forms).
"""
