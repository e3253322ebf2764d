"""Render the broker configuration of the nsjms-activemq image from nsjms's own generator.

``python deploy/images/activemq/render.py CONTEXT_DIR`` (run by ``scripts/images.sh`` with the project on
``PYTHONPATH``) writes two files into the image's build context, both from the templates
``router/node/services/activemq.py`` uses for the embedded broker (same dead-letter policy, scheduler support,
connectors), listening on all container addresses:

* ``activemq-auth.xml``: STOMP and OpenWire require ``@AMQ_LOGIN@`` / ``@AMQ_PASSCODE@``, which the entrypoint
  replaces (XML-escaped) with ``ACTIVEMQ_LOGIN`` / ``ACTIVEMQ_PASSCODE`` from the environment at start;
* ``activemq-anonymous.xml``: anyone connects (test fixtures only; the entrypoint wants ``ACTIVEMQ_ANONYMOUS=1``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from router.node.services import activemq

LISTEN = "0.0.0.0"
STOMP_PORT = 61613
OPENWIRE_PORT = 61616
LOGIN_PLACEHOLDER = "@AMQ_LOGIN@"
PASSCODE_PLACEHOLDER = "@AMQ_PASSCODE@"


def render(authenticate: bool) -> str:
    plugins = (
        activemq.AMQ_AUTH.format(login=LOGIN_PLACEHOLDER, passcode=PASSCODE_PLACEHOLDER) if authenticate else ""
    )
    return activemq.AMQ_XML.format(plugins=plugins, host=LISTEN, openwire=OPENWIRE_PORT, stomp=STOMP_PORT)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: render.py CONTEXT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    (out / "activemq-auth.xml").write_text(render(True))
    (out / "activemq-anonymous.xml").write_text(render(False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
