"""Who may do what on a node's administrative surfaces (docs/security.md).

The mechanism is a **bearer credential in a GIOP service context**: a client presents
``"<principal>:<secret>"`` (a CDR-encapsulated string) under service context id :data:`SERVICE_CONTEXT_ID` on each
request; the node's server request interceptor (:func:`install_server`) looks the principal up in the state
directory's ``credentials/principals.json`` (mode 0600; secrets stored as SHA-256 digests, compared in constant
time) and records the caller in a thread-local for the upcall that follows on the same ORB thread (the credential
itself is checked when the upcall first asks who its caller is: a push never asks, issue 27). The servants of
the administrative interfaces are wrapped by :func:`admin_surface` (every IDL operation of the class, inherited ones
included, so a new operation is guarded by default) or :func:`guard_ops` (named operations of a standard NS
interface); a guarded operation asks :func:`require`, which raises ``CORBA.NO_PERMISSION`` (``COMPLETED_NO``) for an
anonymous caller or one whose role is too low.

Calls the node makes to its own servants from its own threads (restore, a bridge's internal work) never went
through the ORB's request path: :func:`current` returns :data:`INTERNAL` for them. An upcall thread always has the
caller of its current request (set by the interceptor for every incoming request, anonymous included).

A client presents a credential with :func:`install_client` (before its ORB is initialised) and :func:`use_token`
(or :func:`present_from` a state directory, as the CLI does); every request the process sends then carries it.

Exceptions::

    Exception
     └── AuthError           credentials missing, unreadable or malformed in the state directory
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from router.security.files import write_private

__all__ = ["INTERNAL", "SERVICE_CONTEXT_ID", "AuthError", "Authenticator", "Principal", "Role", "acting_as",
           "admin_surface",
           "current", "guard_ops", "install_client", "install_server", "present_from", "presenting", "require",
           "use_token"]

log = logging.getLogger("nsjms.auth")

#: The service context id of an nsjms credential: "NSJA" in ASCII. OMG assigns vendor service context id ranges
#: (VSCID); nsjms has none, and this value lies outside the ranges the OMG standard contexts use (0-25) and
#: omniORB's own. A client of another ORB must use exactly this id (docs/security.md).
SERVICE_CONTEXT_ID = 0x4E534A41
#: NO_PERMISSION minor code of a refusal by the admin guard (vendor-neutral: 0 says nothing to an attacker)
REFUSED_MINOR = 0
CREDENTIALS_DIR = "credentials"
PRINCIPALS_FILE = "principals.json"
TOKEN_SUFFIX = ".token"
#: The principals a node generates on first start: the CLI's operator and a read-only one.
DEFAULT_PRINCIPALS = {"operator": "operator", "reader": "reader"}


class AuthError(Exception):
    """The state directory's credentials are missing, unreadable or malformed."""


class Role(enum.IntEnum):
    """Ordered: a higher role may do what a lower one may."""

    READER = 1
    OPERATOR = 2

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.upper()]
        except KeyError:
            raise AuthError(f"unknown role {text!r} (reader or operator)") from None


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: ``name`` is what the operator log records."""

    name: str
    role: Role


#: The node's own threads: not a remote caller, never refused.
INTERNAL = Principal("node", Role.OPERATOR)

_current = threading.local()


def current() -> Principal | None:
    """The caller of the request this thread serves: a Principal, None for an anonymous remote caller (or any remote
    caller when no server interceptor is installed: fail closed), :data:`INTERNAL` outside an incoming call."""
    import omniORB

    if omniORB.currentCallInfo() is None:
        return INTERNAL
    if not _server["installed"]:
        return None
    caller = getattr(_current, "principal", None)
    if isinstance(caller, _Presented):       # the request's credential, not yet checked: check it now, once
        caller = _current.principal = caller.check()
    return caller


def audit_identity(refused: Callable[[str], BaseException]) -> str:
    """Who an operator log records for the request this thread serves: the authenticated caller's principal, never
    a ``who`` argument the caller sends; ``refused("not authenticated")`` is raised when there is none (unreachable
    behind the admin guards: never record a caller-chosen name). Shared by every admin servant."""
    principal = current()
    if principal is None:
        raise refused("not authenticated")
    return principal.name


def _set_current(principal: Principal | _Presented | None) -> None:
    _current.principal = principal


@dataclass(frozen=True, slots=True)
class _Presented:
    """The credential an incoming request presented, as the interceptor found it (issue 27): checked only when
    something asks who the caller is (:func:`current`: an admin guard, an operator log's identity), once per
    request. A data-path request (a push, a pull) never asks, so it pays neither the decode, nor the file's
    ``stat`` nor the digest; what a guard sees is exactly what an eager check would have given it."""

    op: str
    data: Any = field(repr=False)      # the raw token, secret included: never in a repr, a log or a traceback

    def check(self) -> Principal | None:
        token = _decode(self.data)
        current_auth: Authenticator | None = _server["auth"]
        principal = current_auth.authenticate(token) if token and current_auth else None
        if principal is None:
            name, sep, _ = (token or "").partition(":")
            # a token without ':' is all secret: never log any of it (review finding)
            log.warning("invalid credential presented for %s (%s)", self.op,
                        f"principal {name[:64]!r}" if sep else "malformed credential")
        return principal


@contextlib.contextmanager
def acting_as(principal: Principal) -> Iterator[None]:
    """This thread's calls to the node's own objects carry ``principal`` (the web console's signed-in user), for
    the block: a guard that sees them as a call (not :data:`INTERNAL`) checks that principal's role."""
    previous = getattr(_current, "principal", None)
    _set_current(principal)
    try:
        yield
    finally:
        _set_current(previous)


def require(op: str, role: Role) -> Principal:
    """The current caller if it holds ``role``; else ``CORBA.NO_PERMISSION`` (COMPLETED_NO), logged without any
    secret."""
    from omniORB import CORBA

    who = current()
    if who is not None and who.role >= role:
        return who
    log.warning("refused %s (needs role %s) to %s", op, role.name.lower(),
                "an anonymous caller" if who is None else f"{who.name} (role {who.role.name.lower()})")
    raise CORBA.NO_PERMISSION(REFUSED_MINOR, CORBA.COMPLETED_NO)


# ---------------------------------------------------------------------------------------- guards
T = TypeVar("T", bound=type)


def _guard(fn: Callable[..., Any], op: str, role: Role) -> Callable[..., Any]:
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        require(op, role)
        return fn(*args, **kwargs)

    guarded.__dict__["_nsjms_role"] = role
    return guarded


def remote_caller() -> bool:
    """Whether this thread serves a request that came over the network (GIOP: the call info names a peer), not a
    call the node makes to its own objects (a colocated call, or a direct one: no peer)."""
    import omniORB

    info = omniORB.currentCallInfo()
    return info is not None and "peer_address" in info


def _guard_remote(fn: Callable[..., Any], op: str, role: Role) -> Callable[..., Any]:
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if remote_caller():
            require(op, role)
        return fn(*args, **kwargs)

    guarded.__dict__["_nsjms_role"] = role
    return guarded


def node_internal(cls: T) -> T:
    """Class decorator for a servant only the node itself should call (a bridge's endpoint, which the node's own
    channel pushes to or pulls from): every IDL operation called over the network needs an operator; the node's
    own calls (colocated or direct) pass. Its object id is guessable (``br/<id>/send``): without this, any local
    user could pull a bridge's JMS messages (the channel then acknowledged them: lost) or push into its JMS
    destination without broker credentials (issue 30 review)."""
    for op in idl_operations(cls):
        fn = getattr(cls, op, None)
        if fn is not None and not hasattr(fn, "_nsjms_role"):
            setattr(cls, op, _guard_remote(fn, op, Role.OPERATOR))
    setattr(cls, "_nsjms_node_internal", True)  # noqa: B010 — a marker tests look for
    return cls


def guard_when(cls: T, ops: Iterable[str], role: Role, applies: Callable[[Any], bool]) -> T:
    """Wrap ``ops`` of ``cls`` (those it has): a REMOTE caller needs ``role`` when ``applies(servant)`` is true (a
    proxy or admin that belongs to a bridge); the node's own calls and other servants are untouched."""
    for op in ops:
        fn = getattr(cls, op, None)
        if fn is None or getattr(fn, "_nsjms_guard_when", False):
            continue

        def make(fn: Callable[..., Any], op: str) -> Callable[..., Any]:
            @functools.wraps(fn)
            def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
                if remote_caller() and applies(self):
                    require(op, role)
                return fn(self, *args, **kwargs)

            guarded.__dict__["_nsjms_guard_when"] = True
            return guarded

        setattr(cls, op, make(fn, op))
    return cls


def idl_operations(cls: type) -> set[str]:
    """Every IDL operation (attributes as ``_get_x``/``_set_x``) of an omniORBpy servant class's skeletons."""
    ops: set[str] = set()
    for base in cls.__mro__:
        ops |= set(getattr(base, "_omni_op_d", {}))
    return ops


def admin_surface(*, read: Iterable[str] = ()) -> Callable[[T], T]:
    """Class decorator for the servant of an administrative interface: EVERY IDL operation of the class needs an
    authenticated operator, except those in ``read``, which a reader may call too. New IDL operations are guarded
    without anyone listing them."""
    readable = set(read)

    def wrap(cls: T) -> T:
        for op in idl_operations(cls):
            fn = getattr(cls, op, None)
            if fn is not None and not hasattr(fn, "_nsjms_role"):
                setattr(cls, op, _guard(fn, op, Role.READER if op in readable else Role.OPERATOR))
        setattr(cls, "_nsjms_admin_surface", True)  # noqa: B010 — a marker tests look for
        return cls

    return wrap


def guard_ops(cls: type, ops: dict[str, Role]) -> None:
    """Guard named operations of a servant class of a standard interface (the rest stays open)."""
    for op, role in ops.items():
        fn = getattr(cls, op)
        if not hasattr(fn, "_nsjms_role"):
            setattr(cls, op, _guard(fn, op, role))


# ------------------------------------------------------------------------------------- credentials
def credentials_dir(state_dir: Path) -> Path:
    return state_dir / CREDENTIALS_DIR


def token_path(state_dir: Path, name: str) -> Path:
    return credentials_dir(state_dir) / f"{name}{TOKEN_SUFFIX}"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise AuthError(f"principal name {name!r}: letters, digits, '-', '_' and '.' only")
    return name


def read_principals(state_dir: Path) -> dict[str, dict[str, str]]:
    path = credentials_dir(state_dir) / PRINCIPALS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise AuthError(f"{path}: {type(exc).__name__}") from None
    principals = data.get("principals") if isinstance(data, dict) else None
    if not isinstance(principals, dict):
        raise AuthError(f"{path}: no 'principals' object")
    return {str(k): dict(v) for k, v in principals.items()}


def _write_principals(state_dir: Path, principals: dict[str, dict[str, str]]) -> None:
    write_private(credentials_dir(state_dir) / PRINCIPALS_FILE,
                  json.dumps({"principals": principals}, indent=2, sort_keys=True) + "\n")


def issue(state_dir: Path, name: str, role: Role) -> Path:
    """Create or replace principal ``name`` with a new secret; write its token file (0600); returns its path.
    The old secret stops working at the node's next request (the interceptor reloads a changed file)."""
    _check_name(name)
    credentials_dir(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(credentials_dir(state_dir), 0o700)
    secret = secrets.token_urlsafe(32)
    principals = read_principals(state_dir)
    principals[name] = {"role": role.name.lower(), "sha256": _digest(secret)}
    path = token_path(state_dir, name)
    write_private(path, f"{name}:{secret}\n")
    _write_principals(state_dir, principals)
    return path


def install_token(state_dir: Path, token: str, role: Role) -> None:
    """Register an existing ``name:secret`` token (one the caller made, e.g. a test harness's) as a principal."""
    name, _, secret = token.partition(":")
    _check_name(name)
    if not secret:
        raise AuthError("a token is NAME:SECRET")
    credentials_dir(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    principals = read_principals(state_dir)
    principals[name] = {"role": role.name.lower(), "sha256": _digest(secret)}
    _write_principals(state_dir, principals)


def ensure_defaults(state_dir: Path) -> list[str]:
    """Generate the default principals missing from the state directory; returns the names generated."""
    have = read_principals(state_dir)
    made = []
    for name, role in DEFAULT_PRINCIPALS.items():
        if name not in have or not token_path(state_dir, name).exists():
            issue(state_dir, name, Role.parse(role))
            made.append(name)
    return made


class Authenticator:
    """Maps a presented token to a :class:`Principal`; re-reads ``principals.json`` when it changes (rotation takes
    effect without a restart). Thread-safe; never logs a token."""

    def __init__(self, state_dir: Path) -> None:
        self.path = credentials_dir(state_dir) / PRINCIPALS_FILE
        self.state_dir = state_dir
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._table: dict[str, tuple[str, Role]] = {}

    def _reload(self) -> dict[str, tuple[str, Role]]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp != self._stamp:
                try:
                    rows = read_principals(self.state_dir)
                    self._table = {name: (row["sha256"], Role.parse(row["role"])) for name, row in rows.items()}
                except (AuthError, KeyError) as exc:
                    log.error("credentials unreadable, every admin request refused: %s", exc)
                    self._table = {}
                self._stamp = stamp
            return self._table

    def authenticate(self, token: str) -> Principal | None:
        name, _, secret = token.partition(":")
        entry = self._reload().get(name)
        if entry is None or not secret:
            return None
        if not hmac.compare_digest(entry[0], _digest(secret)):
            return None
        return Principal(name, entry[1])


# ------------------------------------------------------------------------------------- interceptors
def _decode(data: Any) -> str | None:
    import omniORB
    from omniORB import CORBA

    try:
        return str(omniORB.cdrUnmarshal(CORBA.TC_string, bytes(data)))
    except Exception:  # noqa: BLE001 — a malformed context is an anonymous caller, never a crash
        return None


_server: dict[str, Any] = {"installed": False, "auth": None}


def _receive(op: str, contexts: Any) -> None:
    """The server request interceptor: every incoming request sets this thread's caller, anonymous or the credential
    it presented (checked when first asked: :func:`current`)."""
    presented = None
    for cid, data in contexts:
        if cid == SERVICE_CONTEXT_ID:
            presented = _Presented(op, data)
    _current.principal = presented


def install_server(auth: Authenticator) -> bool:
    """Register the server request interceptor (once per process, before the first ``ORB_init``; a later node of the
    same process replaces the authenticator). Every incoming request sets the thread's caller: the principal of a
    valid credential, else anonymous. The credential is checked when the request's upcall first asks for its
    caller (:func:`current`, i.e. a guard or an operator log), so requests that never ask (pushes, pulls: the data
    path) cost the interceptor only the look for the context. A presented but invalid credential is then logged (by
    principal name only) and treated as anonymous. False when it could not be registered: every remote admin call
    is then refused."""
    from omniORB import CORBA, interceptors

    _server["auth"] = auth
    if _server["installed"]:
        return True

    try:
        interceptors.addServerReceiveRequest(_receive)
    except CORBA.BAD_INV_ORDER:
        log.error("the admin credential interceptor cannot be installed (an ORB already runs in this process): "
                  "every remote administrative request is refused")
        return False
    _server["installed"] = True
    return True


_client = {"installed": False, "token": ""}


def install_client() -> bool:
    """Register the client interceptor that presents the token of :func:`use_token` (once per process, before the
    first ``ORB_init``). False when the process's ORB was initialised before (then nothing is presented)."""
    import omniORB
    from omniORB import CORBA, interceptors

    if _client["installed"]:
        return True

    def send(op: str, contexts: Any) -> None:
        token = _client["token"]
        if token:
            contexts.append((SERVICE_CONTEXT_ID, omniORB.cdrMarshal(CORBA.TC_string, token)))

    try:
        interceptors.addClientSendRequest(send)
    except CORBA.BAD_INV_ORDER:
        return False
    _client["installed"] = True
    return True


def use_token(token: str) -> None:
    """The credential this process presents from now on ("" for none)."""
    _client["token"] = token


@contextlib.contextmanager
def presenting(state_dir: Path, name: str = "operator") -> Iterator[bool]:
    """:func:`present_from` for the duration of a block; the process's previous token is presented again after."""
    previous = _client["token"]
    try:
        yield present_from(state_dir, name)
    finally:
        _client["token"] = previous


def present_from(state_dir: Path, name: str = "operator") -> bool:
    """What the CLI does: present principal ``name``'s token from the state directory, if this user may read it.
    Returns whether a token is presented."""
    try:
        token = token_path(state_dir, name).read_text().strip()
    except OSError:
        return False
    install_client()
    use_token(token)
    return True
