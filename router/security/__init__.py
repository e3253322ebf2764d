"""Who may do what on a node, below every layer that serves an administrative surface (docs/security.md).

* :mod:`router.security.auth`: admin credentials in a GIOP service context, roles, the guarded operations;
* :mod:`router.security.files`: state files readable by their owner only (credentials, tokens, the node's records).

See docs/architecture.md ("Layers").
"""
