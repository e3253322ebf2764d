"""``nsjms credentials list | rotate | issue``: the node's generated admin credentials (docs/security.md, "Secrets").

Works on the state directory's files directly (a running node re-reads them at its next request), so it needs the
node's OS user; it never prints a secret, only where the token file is.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["SURFACES", "add_parser", "run"]

#: What ``rotate --surface`` can rotate. The embedded broker's and PostgreSQL's passwords: docs/security.md says how
#: by hand; not automated yet (refused with the exit code of a usage error).
SURFACES = ("admin",)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("credentials", parents=[common],
                       help="list, rotate or issue the node's admin credentials (docs/security.md)")
    csub = p.add_subparsers(dest="credentials_command", required=True, metavar="{list,rotate,issue}")
    csub.add_parser("list", parents=[common], help="principals and their roles (never a secret)")
    r = csub.add_parser("rotate", parents=[common],
                        help="give every principal a new secret; the node accepts only the new ones at once")
    r.add_argument("--surface", choices=SURFACES, default="admin", help="which credentials (default admin)")
    i = csub.add_parser("issue", parents=[common], help="create (or replace) a principal; prints its token file")
    i.add_argument("name", metavar="NAME", help="principal name: what the operator log records")
    i.add_argument("--role", choices=("reader", "operator"), required=True)


def run(args: argparse.Namespace, state_dir: Path, out: Any = print) -> int:
    """Exit codes: 0 ok, 1 failure, 2 usage."""
    from router.auth import AuthError, Role, issue, read_principals, token_path

    try:
        principals = read_principals(state_dir)
        cmd = args.credentials_command
        if cmd == "list":
            for name, row in sorted(principals.items()):
                out(f"{name}: {row.get('role')}  token {token_path(state_dir, name)}")
            if not principals:
                out(f"no admin credentials in {state_dir} (a node generates them at its first start)")
            return 0
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
