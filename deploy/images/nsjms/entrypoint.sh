#!/bin/bash
# Run `nsjms serve` with the configuration from NSJMS_* variables. The ORB listens on all container addresses
# (NSJMS_ORB_HOST=0.0.0.0) and publishes ORB_PUBLISH_HOST:NSJMS_ORB_PORT in its object references
# (omniORB's endPointPublish, given through its ORBendPointPublish environment variable), so that a client on the
# host reaches every object through the port published on the host's loopback. (ORB_PUBLISH_HOST has no NSJMS_
# prefix on purpose: NSJMS_ORB_* variables are nsjms configuration keys, where an unknown key stops the node.)
set -euo pipefail
for var in NSJMS_POSTGRES_DSN NSJMS_BROKER_URL; do
    if [ -z "${!var:-}" ]; then
        echo "nsjms container: $var must be set (a container runs no embedded PostgreSQL or ActiveMQ)" >&2
        exit 2
    fi
done
export ORBendPointPublish="giop:tcp:${ORB_PUBLISH_HOST:-127.0.0.1}:${NSJMS_ORB_PORT:-2809}"
unset ORB_PUBLISH_HOST
exec nsjms serve "$@"
