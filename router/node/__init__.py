"""The node's composition root: what builds, runs and reports one nsjms node (docs/architecture.md, "Layers").

``server`` builds a node (ORB, channel and bridge factories, its services) in its start order, with ``statedir``
(the state directory's lock and access), ``watches`` (the start's checks, service probes, periodic maintenance) and
``publish`` (its references, admin objects and status snapshot) beside it; ``services`` the embedded PostgreSQL and
ActiveMQ; ``lifecycle`` the state-directory lock, service probes and supervision; ``config`` the configuration file;
``status`` the status snapshot; ``cluster`` the node's part in a cluster; ``reset`` ``nsjms reset``'s work.
Nothing here has side effects at import.
"""
