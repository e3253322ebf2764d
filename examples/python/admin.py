"""An administrative client: presents the node's admin credential (docs/security.md) and creates a channel.

    python admin.py --token-file STATE/credentials/operator.token [--factory URL]

Prints ``channel ID``. The credential is the token file's ``NAME:SECRET``, sent on every request of this process as
a CDR-encapsulated IDL string in service context 0x4E534A41 by a client request interceptor registered before
``ORB_init``. Without it (or with a wrong one) the node refuses ``create_channel`` with NO_PERMISSION (exit 4).
Standard omniORBpy and COS stubs only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import omniORB
from omniORB import CORBA, interceptors

import CosNotifyChannelAdmin

NSJMS_CREDENTIAL = 0x4E534A41
DEFAULT_FACTORY = "corbaloc::127.0.0.1:2809/NotifyEventChannelFactory"


def present(token: str) -> None:
    def add(operation: str, contexts: Any) -> None:
        contexts.append((NSJMS_CREDENTIAL, omniORB.cdrMarshal(CORBA.TC_string, token)))

    interceptors.addClientSendRequest(add)   # before ORB_init


def main() -> int:
    p = argparse.ArgumentParser(description="Create a channel as an authorised nsjms operator.")
    p.add_argument("--token-file", help="the node's STATE/credentials/NAME.token")
    p.add_argument("--factory", default=DEFAULT_FACTORY, help="corbaloc URL or IOR of the factory")
    args = p.parse_args()
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            present(f.read().strip())
    orb = CORBA.ORB_init([sys.argv[0], "-ORBclientCallTimeOutPeriod", "30000"], CORBA.ORB_ID)
    try:
        factory = orb.string_to_object(args.factory)._narrow(CosNotifyChannelAdmin.EventChannelFactory)
        _, cid = factory.create_channel([], [])
        print(f"channel {cid}", flush=True)
        return 0
    except CORBA.NO_PERMISSION:
        print("admin: NO_PERMISSION: the node wants an operator's credential (--token-file)", file=sys.stderr)
        return 4
    finally:
        orb.destroy()


if __name__ == "__main__":
    sys.exit(main())
