"""How every ``nsjms`` subcommand ends, whatever it does: one wrapper around the handler (``router.cli.main``).

* A node that does not answer in time (a hung or stopped process: ``CORBA.TIMEOUT``; a dead one: ``TRANSIENT``,
  ``COMM_FAILURE``) is exit 3, "node not reachable", for every command, never a traceback.
* ``--json``: stdout carries JSON only. The command's own output is held until it ends (not a ``txn`` command that
  asks for confirmation on a terminal); when it fails (exit code other than 0) and what it printed is not JSON,
  stdout gets one error object
  ``{"error": {"command": ..., "exit_code": N, "message": ...}}`` instead (the human text still goes to stderr).
* stdout closed early (``nsjms bridge list --json | head -1``): quiet, exit 1, no ``BrokenPipeError`` traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["NOT_REACHABLE", "node_not_answering", "run_handler"]

EXIT_FAILURE, EXIT_NOT_RUNNING = 1, 3
NOT_REACHABLE = "node not reachable"
#: CORBA system exceptions meaning "the node did not answer": its process is hung, stopped, gone or unreachable.
_NOT_ANSWERING = ("TIMEOUT", "TRANSIENT", "COMM_FAILURE", "NO_RESPONSE")
#: Subcommands that stream output while they run (their stdout is not held for --json).
_STREAMING = frozenset({"serve"})


def node_not_answering(exc: BaseException) -> bool:
    """True for a CORBA system exception that means the node did not answer (pure: no omniORB import)."""
    corba = sys.modules.get("omniORB.CORBA")
    return corba is not None and any(isinstance(exc, getattr(corba, name)) for name in _NOT_ANSWERING)


class _Tee(io.TextIOBase):
    """Passes text through to ``target`` (if any) and keeps a copy."""

    def __init__(self, target: Any | None) -> None:
        super().__init__()
        self.target = target
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        if self.target is not None:
            self.target.write(s)
        return len(s)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _guarded(handler: Callable[[argparse.Namespace, Any], int], args: argparse.Namespace, cfg: Any) -> int:
    try:
        return handler(args, cfg)
    except Exception as exc:
        if args.command in _STREAMING or not node_not_answering(exc):  # `serve` is the node: not a client of one
            raise
        print(f"nsjms {args.command}: {NOT_REACHABLE}: {type(exc).__name__} ({exc}): the node's process holds its "
              "endpoints but does not answer in time; is it hung or stopped (SIGSTOP)?", file=sys.stderr)
        return EXIT_NOT_RUNNING


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return bool(text.strip())


def _as_json(handler: Callable[[argparse.Namespace, Any], int], args: argparse.Namespace, cfg: Any) -> int:
    out, err = _Tee(None), _Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _guarded(handler, args, cfg)
    if code == 0 or _is_json(out.text):
        sys.stdout.write(out.text)
    else:
        if out.text:  # human text a command printed on stdout: kept for humans, on stderr
            sys.stderr.write(out.text)
        message = "\n".join(line for line in (err.text + out.text).splitlines() if line.strip())
        sys.stdout.write(json.dumps({"error": {"command": args.command, "exit_code": code, "message": message}})
                         + "\n")
    sys.stdout.flush()
    return code


def _may_ask(args: argparse.Namespace) -> bool:
    """``nsjms txn commit|rollback|forget`` on a terminal without ``--yes`` asks on stdout: never hold that."""
    return args.command == "txn" and not getattr(args, "yes", True) and sys.stdin.isatty()


def run_handler(handler: Callable[[argparse.Namespace, Any], int], args: argparse.Namespace, cfg: Any) -> int:
    """Runs one subcommand's handler with the behaviour described in the module docstring."""
    try:
        if getattr(args, "json", False) and args.command not in _STREAMING and not _may_ask(args):
            return _as_json(handler, args, cfg)
        code = _guarded(handler, args, cfg)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader went away (``| head``): point stdout at /dev/null so the interpreter's final flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
