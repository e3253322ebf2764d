"""How every ``nsjms`` subcommand ends, whatever it does: one wrapper around the handler (``router.cli.main``).

* A node that does not answer in time (a hung or stopped process: ``CORBA.TIMEOUT``; a dead one: ``TRANSIENT``,
  ``COMM_FAILURE``) is exit 3, "node not reachable", for every command, never a traceback.
* Any other CORBA exception the node answers with and the command does not handle itself (a quota's ``IMP_LIMIT``,
  the admin guard's ``NO_PERMISSION``, a destroyed object's ``OBJECT_NOT_EXIST``, a spec's user exception such as
  ``AdminLimitExceeded``) is exit 4, a refusal in words (:func:`corba_error`, which the console shows too).
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
from dataclasses import dataclass
from typing import Any

__all__ = ["NOT_REACHABLE", "CorbaError", "corba_error", "node_not_answering", "not_authorised", "run_handler"]

EXIT_FAILURE, EXIT_NOT_RUNNING, EXIT_REFUSED = 1, 3, 4
NOT_REACHABLE = "node not reachable"
#: CORBA system exceptions meaning "the node did not answer": its process is hung, stopped, gone or unreachable.
_NOT_ANSWERING = ("TIMEOUT", "TRANSIENT", "COMM_FAILURE", "NO_RESPONSE")
#: Subcommands that stream output while they run (their stdout is not held for --json).
_STREAMING = frozenset({"serve"})


def node_not_answering(exc: BaseException) -> bool:
    """True for a CORBA system exception that means the node did not answer (pure: no omniORB import)."""
    corba = sys.modules.get("omniORB.CORBA")
    return corba is not None and any(isinstance(exc, getattr(corba, name)) for name in _NOT_ANSWERING)


@dataclass(frozen=True)
class CorbaError:
    """What a CORBA exception from the node means to an operator: ``unavailable`` (the node did not answer: exit 3,
    the console's 503) or a refusal (exit 4, the console's 409), and the words both print."""

    unavailable: bool
    words: str

    @property
    def exit_code(self) -> int:
        return EXIT_NOT_RUNNING if self.unavailable else EXIT_REFUSED


#: What a system exception means when the node raises it (the others are named with their minor code).
_SYSTEM_WORDS = {
    "IMP_LIMIT": "the node holds its limit of channels, admins, proxies or bridges ([limits] in its configuration, "
                 "docs/security.md \"Quotas\"; its log names the limit)",
    "NO_PERMISSION": "not authorised (the node refused this credential; docs/security.md)",
    "OBJECT_NOT_EXIST": "the object no longer exists (destroyed meanwhile, or the node restarted)",
    "BAD_PARAM": "the node rejected a parameter (its log says which)",
}
_COMPLETION = {"COMPLETED_NO": "nothing was done", "COMPLETED_YES": "it was done",
               "COMPLETED_MAYBE": "it may have been done: check before retrying"}


def not_authorised(presented: bool) -> str:
    """The words of a ``NO_PERMISSION`` refusal (``presented``: a credential was sent)."""
    why = "the node refused this credential" if presented else "no admin credential readable here"
    return f"not authorised ({why}; docs/security.md)"


def corba_error(exc: BaseException) -> CorbaError | None:
    """The operator's reading of a CORBA exception from the node, or None when ``exc`` is not one (pure: no omniORB
    import). System exceptions say what they mean and whether anything was done; a user exception of the specs'
    IDL (one the command does not handle itself) is named by its IDL name with its fields."""
    corba = sys.modules.get("omniORB.CORBA")
    if corba is None or not isinstance(exc, corba.Exception):
        return None
    if node_not_answering(exc):
        return CorbaError(True, f"{NOT_REACHABLE}: {type(exc).__name__} ({exc}): the node's process holds its "
                                "endpoints but does not answer in time; is it hung or stopped (SIGSTOP)?")
    name = type(exc).__name__
    if isinstance(exc, corba.SystemException):
        what = _SYSTEM_WORDS.get(name, f"the node failed the request (minor code {exc.minor})")
        done = _COMPLETION.get(str(exc.completed), "")
        return CorbaError(False, f"refused: {what}: CORBA.{name}" + (f", {done}" if done else ""))
    repo = str(getattr(exc, "_NP_RepositoryId", name))
    idl = repo.split(":")[1].rsplit("/", 2)[-2:] if repo.startswith("IDL:") and "/" in repo else [name]
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(exc).items() if not k.startswith("_"))
    return CorbaError(False, f"refused by the node: {'::'.join(idl)}" + (f" ({fields})" if fields else ""))


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
        error = corba_error(exc)
        if args.command in _STREAMING or error is None:  # `serve` is the node: not a client of one
            raise
        print(f"nsjms {args.command}: {error.words}", file=sys.stderr)
        return error.exit_code


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
