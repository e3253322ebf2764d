"""``nsjms credentials list | rotate | issue``: the node's generated admin credentials (docs/security.md, "Secrets").

Works on the state directory's files directly (a running node re-reads them at its next request), so it needs the
node's OS user; it never prints a secret, only where the token file is.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["SURFACES", "add_parser", "run"]

#: What ``rotate --surface`` can rotate: the admin principals (at once, node running or not), the embedded broker's
#: passcode and the embedded PostgreSQL's superuser password (node stopped: applied at its next start).
SURFACES = ("admin", "broker", "postgres")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("credentials", parents=[common],
                       help="list, rotate or issue the node's admin credentials (docs/security.md)")
    csub = p.add_subparsers(dest="credentials_command", required=True, metavar="{list,rotate,issue}")
    csub.add_parser("list", parents=[common], help="principals and their roles (never a secret)")
    r = csub.add_parser("rotate", parents=[common],
                        help="new secrets: admin (every principal, at once), broker or postgres (node stopped, "
                             "applied at its next start)")
    r.add_argument("--surface", choices=SURFACES, default="admin", help="which credentials (default admin)")
    i = csub.add_parser("issue", parents=[common], help="create (or replace) a principal; prints its token file")
    i.add_argument("name", metavar="NAME", help="principal name: what the operator log records")
    i.add_argument("--role", choices=("reader", "operator"), required=True)


def run(args: argparse.Namespace, state_dir: Path, out: Any = print) -> int:
    """Exit codes: 0 ok, 1 failure, 2 usage, 4 refused (the node runs: a service's secret is rotated stopped)."""
    from router.security.auth import AuthError, Role, issue, read_principals, token_path

    try:
        principals = read_principals(state_dir)
        cmd = args.credentials_command
        if cmd == "list":
            for name, row in sorted(principals.items()):
                out(f"{name}: {row.get('role')}  token {token_path(state_dir, name)}")
            if not principals:
                out(f"no admin credentials in {state_dir} (a node generates them at its first start)")
            return 0
        if cmd == "rotate" and args.surface != "admin":
            return _rotate_service(args.surface, state_dir, out)
        if cmd == "rotate":
            for name, row in sorted(principals.items()):
                issue(state_dir, name, Role.parse(row.get("role", "")))
                out(f"{name}: rotated  token {token_path(state_dir, name)}")
            return 0
        path = issue(state_dir, args.name, Role.parse(args.role))
        out(f"{args.name}: {args.role}  token {path}")
        return 0
    except AuthError as exc:
        out(f"nsjms credentials: {exc}")
        return 2


def _rotate_service(surface: str, state_dir: Path, out: Any) -> int:
    """The embedded broker's or PostgreSQL's generated secret, with the node stopped (its state lock held)."""
    from router.node import services
    from router.node.lifecycle import StateDirLocked, StateLock

    secret_file = state_dir / ("activemq/credentials" if surface == "broker" else "pg/password")
    if not secret_file.exists():
        out(f"nsjms credentials: no embedded {surface} secret in {state_dir} (an external service's credentials "
            "are rotated there and set in the configuration)")
        return 2
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except StateDirLocked:
        out(f"nsjms credentials: rotate --surface {surface} needs the node stopped (it is applied at the next start)")
        return 4
    try:
        if surface == "broker":
            user = services.BROKER_OS_USER if os.geteuid() == 0 else None
            services.EmbeddedActiveMQ(state_dir, 0, 0, authenticate=True, os_user=user).rotate_credentials()
        else:
            services.EmbeddedPostgres(state_dir, 0).rotate_password()
    finally:
        lock.release()
    out(f"{surface}: rotated in {secret_file}; applied at the node's next start")
    return 0
