"""Every node answers for every object key (docs/cluster.md, "CORBA addressing").

The node's persistent POA (``nsjms``, :mod:`router.channel.runtime`) has a servant manager, a
:class:`Forwarder` (a ``PortableServer.ServantActivator``). A request for an object id that is active here is
served as before; omniORB calls :meth:`Forwarder.incarnate` only for an id that is **not** active here, and the
answer comes from the object's owner in PostgreSQL (``nsjms_owner`` and the owner's ``nsjms_member`` row, one
autocommit statement, cached for :data:`CACHE_S` and dropped at every takeover this node does):

* owned by another **live** member: ``PortableServer.ForwardRequest`` with this node's reference for the same id
  re-addressed to the owner's ``host:port``: omniORB replies ``LOCATION_FORWARD`` and the client's ORB sends this
  and later calls to the owner (back to its own reference when the owner cannot be reached);
* owned by a member that is not live (its lease expired, it left, it is being taken over), or by this node but not
  loaded yet (claimed at a takeover, or the node is starting): ``TRANSIENT`` (retry; the object is not gone);
* not owned by anyone (destroyed, never existed) or owned here and loaded but this id is not active (a destroyed
  admin or proxy): ``OBJECT_NOT_EXIST``, as a node without a cluster answers;
* **PostgreSQL cannot be read** (the node is cut from it, or it is down): the owner this node last read for the
  object, when that read is at most :attr:`Forwarder.stale_s` old (the node sets its lease expiry,
  ``cluster.expiry_s``: past it, this node's own lease has run out and its knowledge is older than any lease) and
  named another node whose lease was live: ``LOCATION_FORWARD`` there. That node decides again from PostgreSQL
  (serves the object, forwards to its owner now, or ``TRANSIENT``), so an owner that changed meanwhile costs the
  client a second forward, never a wrong answer. Otherwise ``TRANSIENT``; never ``OBJECT_NOT_EXIST``. After a failed
  look-up that waited (:data:`SLOW_S`) none is tried for :data:`DOWN_S` (each would hold the serialised activator
  for a statement's bound).

The unit of ownership is the channel (its admins and proxies, ``ch/<channel>/...``, its filter factory
``ch/<channel>/ff`` and the filters that factory made, ``flt/<id>`` with the channel in the id:
:func:`filter_id`) and the bridge (``br/<id>`` and its endpoints, which follow their channel's owner). Other ids
(filters of the node-level factory ``flt/factory``, made before filters had a channel) have no owner: they are not
forwarded (``OBJECT_NOT_EXIST`` when not active here). :meth:`Forwarder.incarnate` never returns a servant.

omniORB serialises the calls of a POA's servant activator, so :meth:`Forwarder.incarnate` does one short
statement at most (usually none: cached), and only for requests that reach a node which does not run the object.

**Activation beside the activator** (:meth:`Forwarder.activate`, every servant of the node's POA is activated through
it, ``Runtime.activate``): while omniORB runs ``incarnate`` for an id (a request for it arrived: a client, or a
``LOCATION_FORWARD`` from the node that just handed the channel here), that id is *activating* in the POA's object
table, and ``activate_object_with_id`` of the same id raises ``ObjectAlreadyActive`` although no servant is active
(checked with omniORBpy 4.3.3: ``id_to_servant`` then raises ``ObjectNotActive``). That made a node's load of a
channel handed to it fail half-way (docs/cluster.md, "Loading is all or nothing"). :meth:`Forwarder.activate` waits
such an incarnation out and activates again (an id really active with a servant is refused at once, as before), and
:meth:`Forwarder.incarnate` answers ``TRANSIENT`` at once, without a look-up, for an id being activated here.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import omniORB
from omniORB import CORBA, PortableServer

from router.cluster.ior import Address, IorError, retarget
from router.cluster.lease import Object

__all__ = ["ACTIVATE_WAIT_S", "CACHE_S", "DOWN_S", "FILTER_SPAN", "LOOKUP_WAIT_S", "SLOW_S", "Forward", "Forwarder",
           "Gone", "OwnerRow", "Retry", "cluster_addresses", "cluster_ids", "decide", "endpoint_publish",
           "filter_channel", "filter_id", "lookup_owner", "object_of", "owner_lookup", "parse_address"]

log = logging.getLogger("nsjms.cluster")

CACHE_S = 1.0                      # how long an owner answer is reused (a takeover here drops it at once)
#: After an owner look-up failed, none is tried for this long (the POA serialises its activator's calls: on a cut
#: network each look-up would hold them all for a checkout wait and a statement's bound, router/db/conninfo.py)
DOWN_S = 1.0
SLOW_S = 0.5                       # a failed look-up that took this long starts that pause
LOOKUP_WAIT_S = 2.0                # the longest wait for a pooled connection to read an owner
#: How long :meth:`Forwarder.activate` waits for an incarnation (or a deactivation) of the same id to end: an
#: incarnation is one owner look-up at most (:data:`LOOKUP_WAIT_S` for a connection, then one statement)
ACTIVATE_WAIT_S = 30.0
_OBJECT = "IDL:omg.org/CORBA/Object:1.0"
_NO_MATCH = int(omniORB.OBJECT_NOT_EXIST_NoMatch)   # what a POA without a servant manager answers
_OID = re.compile(r"(ch|br)/(\d{1,10})(?:/.*)?", re.S)
_MAX_ID = 2**31 - 1                # channel and bridge ids are PostgreSQL integers
_FLT = re.compile(r"flt/(\d{1,19})", re.S)
#: A filter made by a channel's filter factory has the id ``(channel + 1) * FILTER_SPAN + n`` (``n`` from the
#: filter sequence, modulo the span): its owner is its channel's, read from the id alone (no lookup, no schema
#: change); ids below the span are filters of the node-level factory (no channel).
FILTER_SPAN = 2**31
_CACHE_MAX = 4096                  # owner answers kept at most (an id nobody owns is asked for once a second at most)


@dataclass(frozen=True)
class OwnerRow:
    """The owner of an object as PostgreSQL says now: its node id, its ORB address, whether its lease is live."""

    node_id: str
    address: str
    live: bool


@dataclass(frozen=True)
class Forward:
    """Served by another live node, at ``address``."""

    node_id: str
    address: Address


@dataclass(frozen=True)
class Retry:
    """Exists, but nobody can serve it right now (owner dead and not taken over yet, or loading here)."""

    why: str


@dataclass(frozen=True)
class Gone:
    """Does not exist (or is served here and this id is not active)."""


Decision = Forward | Retry | Gone


def filter_id(channel: int, n: int) -> int:
    """The id of the ``n``-th filter (a sequence value) made by channel ``channel``'s filter factory."""
    if not 0 <= channel <= _MAX_ID:
        raise ValueError(f"channel id out of range: {channel}")
    return (channel + 1) * FILTER_SPAN + n % FILTER_SPAN


def filter_channel(fid: int) -> int | None:
    """The channel whose filter factory made filter ``fid``; None for a filter of the node-level factory."""
    return fid // FILTER_SPAN - 1 if fid >= FILTER_SPAN else None


def object_of(oid: str) -> Object | None:
    """The owned unit an object id belongs to: ``ch/3/C/1/2`` -> ("channel", 3), ``br/7/recv`` -> ("bridge", 7),
    a filter its channel's (``flt/<id>``, :func:`filter_id`); None for ids without an owner (the node's own
    objects, filters of the node-level factory)."""
    f = _FLT.fullmatch(oid)
    if f is not None:
        cid = filter_channel(int(f.group(1)))
        return None if cid is None or cid > _MAX_ID else ("channel", cid)
    m = _OID.fullmatch(oid)
    if m is None or int(m.group(2)) > _MAX_ID:
        return None                  # (a larger id exists nowhere; asked, PostgreSQL would refuse the parameter)
    return ("channel" if m.group(1) == "ch" else "bridge", int(m.group(2)))


def parse_address(address: str) -> Address | None:
    """``host:port`` (``[v6]:port``) of a member row; None when it is not one."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def decide(row: OwnerRow | None, me: str, loaded_here: bool) -> Decision:
    """Where a request for an object that is not active on this node goes (see the module docstring)."""
    if row is None:
        return Gone()
    if row.node_id == me:
        return Gone() if loaded_here else Retry(f"owned by this node ({me}), not loaded yet")
    if not row.live:
        return Retry(f"owned by {row.node_id}, whose lease is not live (to be taken over)")
    addr = parse_address(row.address)
    if addr is None:
        return Retry(f"owned by {row.node_id}, which published no usable address ({row.address!r})")
    return Forward(row.node_id, addr)


def lookup_owner(conn: Any, obj: Object) -> OwnerRow | None:
    """The owner of an existing channel or bridge (one statement; None when the object does not exist or has no
    owner row)."""
    table = "nsjms_channel" if obj[0] == "channel" else "nsjms_bridge"
    row = conn.execute(
        f"SELECT o.node_id, coalesce(m.address, ''), coalesce(m.state = 'live' AND m.lease_until > clock_timestamp(),"
        f" false) FROM nsjms_owner o JOIN {table} x ON x.id = o.object_id "
        "LEFT JOIN nsjms_member m ON m.node_id = o.node_id WHERE o.kind = %s AND o.object_id = %s", obj).fetchone()
    return None if row is None else OwnerRow(str(row[0]), str(row[1]), bool(row[2]))


class Forwarder(PortableServer.ServantActivator):
    """The servant manager of the node's persistent POA. Until :meth:`configure` it answers ``OBJECT_NOT_EXIST``
    for every id that is not active (a node outside a cluster: what the POA without a servant manager did)."""

    def __init__(self, orb: Any) -> None:
        self.orb = orb
        self._lock = threading.Lock()
        self._cache: dict[Object, tuple[float, OwnerRow | None]] = {}
        self.me: str | None = None
        self._lookup: Callable[[Object], OwnerRow | None] | None = None
        self._loaded: Callable[[Object], bool] = lambda obj: False
        #: set by the node from its runtime's creation until :meth:`configure`: a request for an id not active yet
        #: (a client of the previous incarnation, a pull or push on a proxy not restored yet) is told to retry
        #: (TRANSIENT), not that the object does not exist (which ended such a client before it was restored)
        self.starting = False
        self.forwarded = 0                       # requests answered LOCATION_FORWARD (status)
        self.retried = 0                         # requests answered TRANSIENT
        self.activation_waits = 0                # activations that waited for an incarnation of their id
        #: how long an owner read is used when PostgreSQL cannot be read (0: never; the node sets its lease expiry)
        self.stale_s = 0.0
        self.forwarded_stale = 0                 # of ``forwarded``: answered from an owner read before a failure
        self._down_until = 0.0                   # no look-up before this (the last one failed)
        self._activating: dict[bytes, int] = {}  # ids being activated here (incarnate answers TRANSIENT at once)
        self._recorded = threading.local()       # the ids a load activated, per thread (:meth:`recording`)

    def configure(self, me: str, lookup: Callable[[Object], OwnerRow | None],
                  loaded: Callable[[Object], bool]) -> None:
        """``me``: this node's id; ``lookup``: the owner row in PostgreSQL; ``loaded``: whether this node runs the
        unit now."""
        self.me, self._lookup, self._loaded = me, lookup, loaded
        self.starting = False

    def invalidate(self) -> None:
        """Forget every cached owner (this node took something over)."""
        with self._lock:
            self._cache.clear()

    def where(self, obj: Object) -> Decision:
        """Where requests for ``obj`` go, as :func:`decide` says (the owner row cached for :data:`CACHE_S`)."""
        if self._lookup is None or self.me is None:
            if self.starting:
                return Retry("the node is starting: its objects are being loaded")
            return Gone()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(obj)
        if hit is not None and now - hit[0] < CACHE_S and (hit[1] is None or hit[1].node_id != self.me):
            row = hit[1]
        else:                        # (owned here: what runs here decides, and the row may be of a destroyed one)
            try:
                if now < self._down_until:
                    raise ConnectionError("PostgreSQL did not answer the last owner look-up")
                row = self._lookup(obj)
            except Exception:
                failed_at = time.monotonic()
                if failed_at - now >= SLOW_S:                # it waited (a cut network), not refused at once
                    with self._lock:
                        self._down_until = max(self._down_until, failed_at + DOWN_S)
                last = self._last_known(obj, hit, now)
                if last is None:
                    raise                                    # the caller answers TRANSIENT
                return last
            with self._lock:
                if len(self._cache) >= _CACHE_MAX:           # requests run before any auth: bounded, stale first
                    self._cache = {k: v for k, v in self._cache.items() if now - v[0] < CACHE_S}
                    if len(self._cache) >= _CACHE_MAX:
                        self._cache.clear()
                self._cache[obj] = (now, row)
        return decide(row, self.me, self._loaded(obj))

    def _last_known(self, obj: Object, hit: tuple[float, OwnerRow | None] | None, now: float) -> Forward | None:
        """PostgreSQL cannot be read: the owner this node last read for ``obj``, when that read is at most
        :attr:`stale_s` old and named another node whose lease was live (module docstring, "cut from PostgreSQL");
        None otherwise (TRANSIENT)."""
        if hit is None or hit[1] is None or now - hit[0] > self.stale_s:
            return None
        row = hit[1]
        if row.node_id == self.me or not row.live:
            return None
        decision = decide(row, self.me or "", False)
        if not isinstance(decision, Forward):
            return None
        with self._lock:
            self.forwarded_stale += 1
        return decision

    def reference_for(self, poa: Any, oid: str, repo_id: str) -> Any | None:
        """For a factory's lookup by id (``get_event_channel``, ``get_bridge_with_id``) of an object this node does
        not run: this node's reference for ``oid`` (its requests are forwarded to the live owner) when another live
        node runs it; ``TRANSIENT`` while its owner is not live (or PostgreSQL cannot say); None when nobody owns it
        (the factory raises its not-found exception)."""
        obj = object_of(oid)
        if obj is None:
            return None
        try:
            where = self.where(obj)
        except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: it may exist; ask again
            log.warning("cluster: owner of %s unknown (%s): TRANSIENT", oid, exc)
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from None
        if isinstance(where, Forward):
            return poa.create_reference_with_id(oid.encode(), repo_id)
        if isinstance(where, Retry):
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        return None

    def forward_reference(self, poa: Any, oid: bytes, to: Address) -> Any:
        """This node's reference for ``oid`` re-addressed to ``to`` alone. No alternates on purpose: when the
        owner cannot be reached, omniORB goes back to the reference the client had (whose alternates name every
        node) and retries with a growing pause (``TRANSIENT_FailedOnForwarded``); with this node as an alternate it
        would bounce between the dead owner and this node without a pause until the owner's lease expired."""
        ref = poa.create_reference_with_id(oid, _OBJECT)
        text = retarget(str(self.orb.object_to_string(ref)), to, [])
        return self.orb.string_to_object(text)

    # -- activation (see the module docstring) ----------------------------------------------------------------
    def activate(self, poa: Any, oid: bytes, servant: Any) -> None:
        """``poa.activate_object_with_id(oid, servant)``, waiting (at most :data:`ACTIVATE_WAIT_S`) while an
        incarnation or a deactivation of ``oid`` is in progress in the POA; an id active with a servant raises
        ``ObjectAlreadyActive`` at once. The id is recorded for :meth:`recording`."""
        with self._lock:
            self._activating[oid] = self._activating.get(oid, 0) + 1
        try:
            deadline = time.monotonic() + ACTIVATE_WAIT_S
            pause = 0.001
            while True:
                try:
                    poa.activate_object_with_id(oid, servant)
                    break
                except PortableServer.POA.ObjectAlreadyActive:
                    if _has_servant(poa, oid) or time.monotonic() > deadline:
                        raise
                with self._lock:
                    self.activation_waits += 1
                log.debug("cluster: %r is being incarnated (a request for it arrived): activated again",
                          oid.decode("utf-8", "replace"))
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        finally:
            with self._lock:
                left = self._activating.pop(oid) - 1
                if left:
                    self._activating[oid] = left
        made = getattr(self._recorded, "ids", None)
        if made is not None:
            made.append(oid)

    @contextmanager
    def recording(self) -> Iterator[list[bytes]]:
        """The ids this thread activates through :meth:`activate` inside the block (a load undoes them when it
        fails: router/channel/channel.py)."""
        outer = getattr(self._recorded, "ids", None)
        made: list[bytes] = []
        self._recorded.ids = made
        try:
            yield made
        finally:
            self._recorded.ids = outer
            if outer is not None:
                outer.extend(made)

    # -- PortableServer.ServantActivator -------------------------------------------------------------------
    def incarnate(self, oid: bytes, adapter: Any) -> Any:
        key = oid.decode("utf-8", "replace")
        with self._lock:
            being_activated = oid in self._activating
        if being_activated:                     # its servant is being activated here: asked again, it is served
            self.retried += 1
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        obj = object_of(key)
        if obj is None:
            raise CORBA.OBJECT_NOT_EXIST(_NO_MATCH, CORBA.COMPLETED_NO)
        try:
            decision = self.where(obj)
        except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: the object is not gone, ask again
            log.warning("cluster: owner of %s unknown (%s): TRANSIENT", key, exc)
            self.retried += 1
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from None
        if isinstance(decision, Forward):
            try:
                ref = self.forward_reference(adapter, oid, decision.address)
            except (IorError, CORBA.Exception) as exc:
                log.warning("cluster: cannot forward %s to %s (%s): TRANSIENT", key, decision.node_id, exc)
                self.retried += 1
                raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO) from None
            self.forwarded += 1
            log.debug("cluster: %s forwarded to %s at %s:%d", key, decision.node_id, *decision.address)
            raise PortableServer.ForwardRequest(ref)
        if isinstance(decision, Retry):
            self.retried += 1
            log.debug("cluster: %s: TRANSIENT (%s)", key, decision.why)
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        raise CORBA.OBJECT_NOT_EXIST(_NO_MATCH, CORBA.COMPLETED_NO)

    def etherealize(self, oid: bytes, adapter: Any, serv: Any, cleanup_in_progress: bool,
                    remaining_activations: bool) -> None:
        """Objects are deactivated by their owners' code (``Runtime.deactivate``); nothing to release here."""


def _has_servant(poa: Any, oid: bytes) -> bool:
    """Whether ``oid`` is active in ``poa`` with a servant (not merely being incarnated or deactivated)."""
    try:
        poa.id_to_servant(oid)
    except PortableServer.POA.ObjectNotActive:
        return False
    return True


def owner_lookup(db: Any) -> Callable[[Object], OwnerRow | None]:
    """:func:`lookup_owner` over a node's :class:`router.db.Database`, one autocommit statement per call (no unit
    of work: a read needs neither the fence check nor a transaction). A pooled connection is waited for at most
    :data:`LOOKUP_WAIT_S` (the POA serialises its activator's calls: a starved pool must not hold them all); the
    caller answers TRANSIENT when it fails."""
    def lookup(obj: Object) -> OwnerRow | None:
        with db.statement(timeout=LOOKUP_WAIT_S) as conn:
            return lookup_owner(conn, obj)

    return lookup


def cluster_ids(db: Any, kind: str, here: Iterable[int]) -> list[int]:
    """A factory's listing for the cluster (``get_all_channels``, ``get_all_bridges``; NS 3.4.18.2: the channels
    the factory created, and every node's factory is the same one): the ``kind`` objects PostgreSQL holds with an
    owner, whichever node runs them, and ``here`` (what this node runs). One autocommit read (its pooled connection
    waited for at most :data:`LOOKUP_WAIT_S`). When PostgreSQL cannot be read, this node's own list (logged: the
    others' are unknown then): ``TRANSIENT`` there made ``nsjms status`` report a node that answers as not running
    (exit 3) during a database outage, where it reports it degraded (exit 8), and emptied the console's lists."""
    table = {"channel": "nsjms_channel", "bridge": "nsjms_bridge"}[kind]
    try:
        with db.statement(timeout=LOOKUP_WAIT_S) as conn:
            rows = conn.execute(f"SELECT x.id FROM {table} x JOIN nsjms_owner o ON o.kind = %s "
                                "AND o.object_id = x.id", (kind,)).fetchall()
    except Exception as exc:  # noqa: BLE001 - PostgreSQL away: the other nodes' objects are unknown now
        log.warning("cluster: the %ss of other nodes are unknown (%s): listing this node's only", kind, exc)
        return sorted(set(here))
    return sorted(set(here) | {int(r[0]) for r in rows})


def cluster_addresses(conn: Any, me: str, own: str, peers: Sequence[str]) -> list[str]:
    """The ``host:port`` list a node publishes in its references: its own first, then the configured peers
    (``cluster.peers``), then the address of every other member PostgreSQL knows that has not left for good (a
    node that died may come back on the same address), without repeats."""
    rows = conn.execute("SELECT address FROM nsjms_member WHERE node_id <> %s AND state <> 'left' "
                        "AND address <> '' ORDER BY node_id", (me,)).fetchall()
    out = [own, *peers, *(str(r[0]) for r in rows)]
    return [a for a in dict.fromkeys(out) if parse_address(a) is not None]


def endpoint_publish(addresses: Sequence[str]) -> list[str]:
    """omniORB's ``-ORBendPointPublish`` for ``addresses`` (the first is the main IIOP address of every reference,
    the others ``TAG_ALTERNATE_IIOP_ADDRESS`` components, which an omniORB client tries in order when a connection
    to the one in use fails); empty for a single address (the ORB publishes its endpoint by itself)."""
    if len(addresses) < 2:
        return []
    eps = []
    for a in addresses:
        parsed = parse_address(a)
        assert parsed is not None
        host = f"[{parsed[0]}]" if ":" in parsed[0] else parsed[0]
        eps.append(f"giop:tcp:{host}:{parsed[1]}")
    return ["-ORBendPointPublish", ",".join(eps)]
