"""The node's composition root: what builds, runs and reports one nsjms node (docs/architecture.md, "Layers").

``server`` builds a node (ORB, channel and bridge factories, its services); ``services`` the embedded PostgreSQL and
ActiveMQ; ``lifecycle`` the state-directory lock, service probes and supervision; ``config`` the configuration file;
``status`` the status snapshot; ``cluster`` the node's part in a cluster; ``reset`` ``nsjms reset``'s work.
Nothing here has side effects at import.
"""
