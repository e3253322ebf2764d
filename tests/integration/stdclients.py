"""Independent CORBA Notification Service clients built only on the standard OMG stubs shipped with omniORB.

Nothing here imports the project (``router``, ``xa``, ``idl``): these clients check the channel from the outside,
the way a third-party supplier or consumer would.

Contents:

* events: :func:`make_event` / :func:`make_any` build "event *i*" in structured or Any form with a checkable
  payload; :func:`event_id` recovers *i* from anything a consumer may receive (Structured, ``%ANY``-wrapped Any,
  Any holding a StructuredEvent, plain Any) and raises ``AssertionError`` when the content was damaged;
* QoS helpers: :func:`prop`, :func:`short`, :func:`long_`, :func:`boolean`, :func:`time_t`, :func:`utc_in`;
* consumer servants (push): :class:`AnyPushConsumer`, :class:`StructuredPushConsumer`,
  :class:`SequencePushConsumer`, all :class:`Recorder` subclasses with ``wait_for(n, timeout)``;
* supplier servants (pull): :class:`AnyPullSupplier`, :class:`StructuredPullSupplier`,
  :class:`SequencePullSupplier` serve a prepared list to the channel;
* client-side endpoints: :class:`PushSupplierClient` (connects a push supplier servant and pushes through the
  proxy) and :class:`PullConsumerClient` (connects and drains a proxy supplier with ``try_pull*``);
* :func:`obtain_proxy_consumer` / :func:`obtain_proxy_supplier` create Notification-style proxies of a given
  form and style and narrow them to the concrete proxy interface.
"""

from __future__ import annotations

import enum
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA, PortableServer  # noqa: F401

import CosEventComm
import CosEventComm__POA  # noqa: F401  (re-exported for test modules)
import CosNotification
import CosNotifyChannelAdmin
import CosNotifyComm  # noqa: F401
import CosNotifyComm__POA
import TimeBase

__all__ = [
    "TEST_DOMAIN",
    "TEST_TYPE",
    "AnyPullSupplier",
    "AnyPushConsumer",
    "Form",
    "PullConsumerClient",
    "PushSupplierClient",
    "Recorder",
    "SequencePullSupplier",
    "SequencePushConsumer",
    "StructuredPullSupplier",
    "StructuredPushConsumer",
    "Style",
    "boolean",
    "connect_pull_supplier",
    "connect_push_consumer",
    "deactivate",
    "event_id",
    "header_value",
    "long_",
    "make_any",
    "make_event",
    "make_item",
    "make_pull_supplier",
    "make_push_consumer",
    "obtain_proxy_consumer",
    "obtain_proxy_supplier",
    "persistent_qos",
    "prop",
    "short",
    "time_t",
    "unreachable_reference",
    "utc_in",
    "wait_until",
]

TEST_DOMAIN = "nsjms.test"
TEST_TYPE = "Tick"
_ANY_PREFIX = "any-event:"
_UTC_EPOCH_OFFSET = 122_192_928_000_000_000  # 100 ns ticks between 1582-10-15 and 1970-01-01


class Form(enum.Enum):
    """Event form of a proxy or client (NS Table 2-1)."""

    ANY = "any"
    STRUCTURED = "structured"
    SEQUENCE = "sequence"

    @property
    def client_type(self) -> Any:
        """The ``CosNotifyChannelAdmin.ClientType`` for this form."""
        return {
            Form.ANY: CosNotifyChannelAdmin.ANY_EVENT,
            Form.STRUCTURED: CosNotifyChannelAdmin.STRUCTURED_EVENT,
            Form.SEQUENCE: CosNotifyChannelAdmin.SEQUENCE_EVENT,
        }[self]


class Style(enum.Enum):
    """Push or pull."""

    PUSH = "push"
    PULL = "pull"


# --------------------------------------------------------------------------------------------------- QoS values


def prop(name: str, value: Any) -> Any:
    """A ``CosNotification.Property``; ``value`` must already be a ``CORBA.Any``."""
    return CosNotification.Property(name, value)


def short(v: int) -> Any:
    """Any holding a CORBA short."""
    return CORBA.Any(CORBA.TC_short, v)


def persistent_qos() -> list[Any]:
    """QoS of a channel whose events and connections are Persistent: what a bridge to a JMS *queue* needs
    (NJI Table 2-3 gives BestEffort no point-to-point counterpart)."""
    return [prop("EventReliability", short(CosNotification.Persistent)),
            prop("ConnectionReliability", short(CosNotification.Persistent))]


def long_(v: int) -> Any:
    """Any holding a CORBA long."""
    return CORBA.Any(CORBA.TC_long, v)


def boolean(v: bool) -> Any:
    """Any holding a CORBA boolean."""
    return CORBA.Any(CORBA.TC_boolean, v)


def time_t(seconds: float) -> Any:
    """Any holding a relative ``TimeBase::TimeT`` (100 ns units)."""
    return CORBA.Any(TimeBase._tc_TimeT, int(seconds * 10_000_000))


def utc_in(seconds: float) -> Any:
    """Any holding an absolute ``TimeBase::UtcT`` ``seconds`` from now."""
    ticks = int((time.time() + seconds) * 10_000_000) + _UTC_EPOCH_OFFSET
    return CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(ticks, 0, 0, 0))


# -------------------------------------------------------------------------------------------------------- events


def _payload(i: int) -> str:
    """The remainder_of_body text of event ``i``: long enough to notice truncation, derived from ``i``."""
    return f"payload-{i:06d}-" + "abcdefghij" * 5 + f"-end-{i}"


def make_event(
    i: int,
    *,
    priority: int | None = None,
    reliability: int | None = None,
    timeout_s: float | None = None,
    start_in_s: float | None = None,
    extra_header: Iterable[Any] = (),
) -> Any:
    """Structured event *i*: filterable_data ``n`` = i (long), remainder_of_body = a string derived from i."""
    header: list[Any] = []
    if priority is not None:
        header.append(prop("Priority", short(priority)))
    if reliability is not None:
        header.append(prop("EventReliability", short(reliability)))
    if timeout_s is not None:
        header.append(prop("Timeout", time_t(timeout_s)))
    if start_in_s is not None:
        header.append(prop("StartTime", utc_in(start_in_s)))
    header.extend(extra_header)
    fixed = CosNotification.FixedEventHeader(CosNotification.EventType(TEST_DOMAIN, TEST_TYPE), f"e{i}")
    return CosNotification.StructuredEvent(
        CosNotification.EventHeader(fixed, header),
        [prop("n", long_(i)), prop("tag", CORBA.Any(CORBA.TC_string, f"t{i % 7}"))],
        CORBA.Any(CORBA.TC_string, _payload(i)),
    )


def make_any(i: int) -> Any:
    """Untyped event *i*: an Any holding a string that encodes i and its payload."""
    return CORBA.Any(CORBA.TC_string, f"{_ANY_PREFIX}{i}:{_payload(i)}")


def make_item(form: Form, i: int, **kw: Any) -> Any:
    """Event *i* in the form a supplier of ``form`` sends (sequence suppliers send structured events)."""
    return make_any(i) if form is Form.ANY else make_event(i, **kw)


def _id_from_any_string(text: str) -> int:
    assert text.startswith(_ANY_PREFIX), f"unexpected Any payload {text!r}"
    number, _, payload = text[len(_ANY_PREFIX):].partition(":")
    i = int(number)
    assert payload == _payload(i), f"Any payload of event {i} damaged: {payload!r}"
    return i


def _id_from_structured(ev: Any) -> int:
    if ev.header.fixed_header.event_type.type_name == "%ANY":
        assert ev.header.fixed_header.event_type.domain_name == "", "%ANY events have an empty domain (NS 2.1.4)"
        return _id_from_any(ev.remainder_of_body)
    fd = {p.name: p.value.value() for p in ev.filterable_data}
    i = int(fd["n"])
    assert fd["tag"] == f"t{i % 7}", f"filterable_data of event {i} damaged: {fd}"
    assert ev.header.fixed_header.event_type.domain_name == TEST_DOMAIN
    assert ev.header.fixed_header.event_type.type_name == TEST_TYPE
    assert ev.header.fixed_header.event_name == f"e{i}"
    assert ev.remainder_of_body.value() == _payload(i), f"remainder_of_body of event {i} damaged"
    return i


def _id_from_any(a: Any) -> int:
    if a.typecode().equivalent(CosNotification._tc_StructuredEvent):
        return _id_from_structured(a.value())
    assert a.typecode().kind() == CORBA.tk_string, f"unexpected Any type {a.typecode().kind()}"
    return _id_from_any_string(a.value())


def event_id(received: Any) -> int:
    """The id *i* of a received event in any form; asserts that its content is intact."""
    if isinstance(received, CORBA.Any):
        return _id_from_any(received)
    return _id_from_structured(received)


def header_value(ev: Any, name: str) -> Any:
    """Value of the optional header field ``name`` of a structured event, or None."""
    for p in ev.header.variable_header:
        if p.name == name:
            return p.value.value()
    return None


# --------------------------------------------------------------------------------------------- push consumers


class Recorder:
    """Thread-safe record of received events (in arrival order) with their arrival times."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.items: list[Any] = []
        self.times: list[float] = []
        self.disconnected = threading.Event()
        self.stop = threading.Event()  # set to release any servant that sleeps (see ``delay``)
        self.delay = 0.0
        self.raise_disconnected = False

    def _record(self, items: Sequence[Any]) -> None:
        if self.raise_disconnected:
            raise CosEventComm.Disconnected()
        if self.delay:
            self.stop.wait(self.delay)
        now = time.monotonic()
        with self._cond:
            self.items.extend(items)
            self.times.extend([now] * len(items))
            self._cond.notify_all()

    def count(self) -> int:
        """Number of events received so far."""
        with self._cond:
            return len(self.items)

    def wait_for(self, n: int, timeout: float) -> bool:
        """Wait until at least ``n`` events arrived; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= n, timeout)

    def snapshot(self) -> list[Any]:
        """A copy of the received events."""
        with self._cond:
            return list(self.items)

    def ids(self) -> list[int]:
        """Ids of the received events, in arrival order (content checked)."""
        return [event_id(x) for x in self.snapshot()]


class AnyPushConsumer(CosNotifyComm__POA.PushConsumer, Recorder):
    """CosNotifyComm::PushConsumer recording Anys."""

    def push(self, data: Any) -> None:
        self._record([data])

    def disconnect_push_consumer(self) -> None:
        self.disconnected.set()

    def offer_change(self, added: Any, removed: Any) -> None:
        pass


class StructuredPushConsumer(CosNotifyComm__POA.StructuredPushConsumer, Recorder):
    """CosNotifyComm::StructuredPushConsumer recording StructuredEvents."""

    def push_structured_event(self, notification: Any) -> None:
        self._record([notification])

    def disconnect_structured_push_consumer(self) -> None:
        self.disconnected.set()

    def offer_change(self, added: Any, removed: Any) -> None:
        pass


class SequencePushConsumer(CosNotifyComm__POA.SequencePushConsumer, Recorder):
    """CosNotifyComm::SequencePushConsumer recording events and the size and time of every batch."""

    def __init__(self) -> None:
        Recorder.__init__(self)
        self.batches: list[tuple[float, int]] = []

    def push_structured_events(self, notifications: Any) -> None:
        with self._cond:
            self.batches.append((time.monotonic(), len(notifications)))
        self._record(list(notifications))

    def disconnect_sequence_push_consumer(self) -> None:
        self.disconnected.set()

    def offer_change(self, added: Any, removed: Any) -> None:
        pass


def make_push_consumer(form: Form) -> Recorder:
    """A push consumer servant of ``form``."""
    return {Form.ANY: AnyPushConsumer, Form.STRUCTURED: StructuredPushConsumer,
            Form.SEQUENCE: SequencePushConsumer}[form]()


# ---------------------------------------------------------------------------------------------- pull suppliers


class _Source:
    """Thread-safe list of prepared items handed out in order; ``close`` makes blocking pulls end."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._cond = threading.Condition()
        self._items = list(items)
        self._next = 0
        self.closed = False
        self.disconnected = threading.Event()

    def add(self, items: Iterable[Any]) -> None:
        """Append more items to serve."""
        with self._cond:
            self._items.extend(items)
            self._cond.notify_all()

    def close(self) -> None:
        """Release blocked pulls (they raise Disconnected)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def served(self) -> int:
        """How many items were handed out."""
        with self._cond:
            return self._next

    def wait_served(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` items were handed out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._next >= n, timeout)

    def _take(self, max_n: int, block: bool) -> list[Any]:
        with self._cond:
            if block:
                self._cond.wait_for(lambda: self.closed or self._next < len(self._items))
            if self.closed:
                raise CosEventComm.Disconnected()
            out = self._items[self._next:self._next + max(1, max_n)]
            self._next += len(out)
            self._cond.notify_all()
            return out


class AnyPullSupplier(CosNotifyComm__POA.PullSupplier, _Source):
    """CosNotifyComm::PullSupplier serving prepared Anys."""

    def pull(self) -> Any:
        return self._take(1, True)[0]

    def try_pull(self) -> Any:
        got = self._take(1, False)
        return (got[0], True) if got else (CORBA.Any(CORBA.TC_null, None), False)

    def disconnect_pull_supplier(self) -> None:
        self.disconnected.set()

    def subscription_change(self, added: Any, removed: Any) -> None:
        pass


class StructuredPullSupplier(CosNotifyComm__POA.StructuredPullSupplier, _Source):
    """CosNotifyComm::StructuredPullSupplier serving prepared StructuredEvents."""

    def pull_structured_event(self) -> Any:
        return self._take(1, True)[0]

    def try_pull_structured_event(self) -> Any:
        got = self._take(1, False)
        return (got[0], True) if got else (make_event(-1), False)

    def disconnect_structured_pull_supplier(self) -> None:
        self.disconnected.set()

    def subscription_change(self, added: Any, removed: Any) -> None:
        pass


class SequencePullSupplier(CosNotifyComm__POA.SequencePullSupplier, _Source):
    """CosNotifyComm::SequencePullSupplier serving prepared StructuredEvents in batches of ``max_number``."""

    def pull_structured_events(self, max_number: int) -> Any:
        return self._take(max_number, True)

    def try_pull_structured_events(self, max_number: int) -> Any:
        got = self._take(max_number, False)
        return got, bool(got)

    def disconnect_sequence_pull_supplier(self) -> None:
        self.disconnected.set()

    def subscription_change(self, added: Any, removed: Any) -> None:
        pass


def make_pull_supplier(form: Form, items: Iterable[Any]) -> _Source:
    """A pull supplier servant of ``form`` serving ``items``."""
    return {Form.ANY: AnyPullSupplier, Form.STRUCTURED: StructuredPullSupplier,
            Form.SEQUENCE: SequencePullSupplier}[form](items)


# ----------------------------------------------------------------------------- push suppliers / pull consumers


class _Disconnectable:
    """Client servant that only records the channel's disconnect call."""

    def __init__(self) -> None:
        self.disconnected = threading.Event()

    def _disconnect(self) -> None:
        self.disconnected.set()

    def subscription_change(self, added: Any, removed: Any) -> None:
        pass

    def offer_change(self, added: Any, removed: Any) -> None:
        pass


class _AnyPushSupplierServant(CosNotifyComm__POA.PushSupplier, _Disconnectable):
    def disconnect_push_supplier(self) -> None:
        self._disconnect()


class _StructuredPushSupplierServant(CosNotifyComm__POA.StructuredPushSupplier, _Disconnectable):
    def disconnect_structured_push_supplier(self) -> None:
        self._disconnect()


class _SequencePushSupplierServant(CosNotifyComm__POA.SequencePushSupplier, _Disconnectable):
    def disconnect_sequence_push_supplier(self) -> None:
        self._disconnect()


class _AnyPullConsumerServant(CosNotifyComm__POA.PullConsumer, _Disconnectable):
    def disconnect_pull_consumer(self) -> None:
        self._disconnect()


class _StructuredPullConsumerServant(CosNotifyComm__POA.StructuredPullConsumer, _Disconnectable):
    def disconnect_structured_pull_consumer(self) -> None:
        self._disconnect()


class _SequencePullConsumerServant(CosNotifyComm__POA.SequencePullConsumer, _Disconnectable):
    def disconnect_sequence_pull_consumer(self) -> None:
        self._disconnect()


_PROXY_CONSUMER_IFACE = {
    (Form.ANY, Style.PUSH): CosNotifyChannelAdmin.ProxyPushConsumer,
    (Form.STRUCTURED, Style.PUSH): CosNotifyChannelAdmin.StructuredProxyPushConsumer,
    (Form.SEQUENCE, Style.PUSH): CosNotifyChannelAdmin.SequenceProxyPushConsumer,
    (Form.ANY, Style.PULL): CosNotifyChannelAdmin.ProxyPullConsumer,
    (Form.STRUCTURED, Style.PULL): CosNotifyChannelAdmin.StructuredProxyPullConsumer,
    (Form.SEQUENCE, Style.PULL): CosNotifyChannelAdmin.SequenceProxyPullConsumer,
}

_PROXY_SUPPLIER_IFACE = {
    (Form.ANY, Style.PUSH): CosNotifyChannelAdmin.ProxyPushSupplier,
    (Form.STRUCTURED, Style.PUSH): CosNotifyChannelAdmin.StructuredProxyPushSupplier,
    (Form.SEQUENCE, Style.PUSH): CosNotifyChannelAdmin.SequenceProxyPushSupplier,
    (Form.ANY, Style.PULL): CosNotifyChannelAdmin.ProxyPullSupplier,
    (Form.STRUCTURED, Style.PULL): CosNotifyChannelAdmin.StructuredProxyPullSupplier,
    (Form.SEQUENCE, Style.PULL): CosNotifyChannelAdmin.SequenceProxyPullSupplier,
}


def obtain_proxy_consumer(admin: Any, form: Form, style: Style) -> tuple[Any, int]:
    """Create a proxy consumer on a SupplierAdmin and narrow it to its concrete interface."""
    op = admin.obtain_notification_push_consumer if style is Style.PUSH else admin.obtain_notification_pull_consumer
    proxy, pid = op(form.client_type)
    narrowed = proxy._narrow(_PROXY_CONSUMER_IFACE[(form, style)])
    assert narrowed is not None, f"proxy {pid} is not a {_PROXY_CONSUMER_IFACE[(form, style)].__name__}"
    return narrowed, pid


def obtain_proxy_supplier(admin: Any, form: Form, style: Style) -> tuple[Any, int]:
    """Create a proxy supplier on a ConsumerAdmin and narrow it to its concrete interface."""
    op = admin.obtain_notification_push_supplier if style is Style.PUSH else admin.obtain_notification_pull_supplier
    proxy, pid = op(form.client_type)
    narrowed = proxy._narrow(_PROXY_SUPPLIER_IFACE[(form, style)])
    assert narrowed is not None, f"proxy {pid} is not a {_PROXY_SUPPLIER_IFACE[(form, style)].__name__}"
    return narrowed, pid


def connect_push_consumer(proxy: Any, form: Form, servant: Any) -> Any:
    """Connect a push consumer servant (activated implicitly) to a proxy push supplier; returns its reference."""
    ref = servant._this()
    {Form.ANY: lambda: proxy.connect_any_push_consumer(ref),
     Form.STRUCTURED: lambda: proxy.connect_structured_push_consumer(ref),
     Form.SEQUENCE: lambda: proxy.connect_sequence_push_consumer(ref)}[form]()
    return ref


def connect_pull_supplier(proxy: Any, form: Form, servant: Any) -> Any:
    """Connect a pull supplier servant to a proxy pull consumer; returns its reference."""
    ref = servant._this()
    {Form.ANY: lambda: proxy.connect_any_pull_supplier(ref),
     Form.STRUCTURED: lambda: proxy.connect_structured_pull_supplier(ref),
     Form.SEQUENCE: lambda: proxy.connect_sequence_pull_supplier(ref)}[form]()
    return ref


@dataclass
class PushSupplierClient:
    """A push supplier: connects a supplier servant to a proxy push consumer and pushes through it."""

    proxy: Any
    form: Form
    batch_size: int = 10

    def connect(self) -> _Disconnectable:
        """Connect a supplier servant (so the channel can call disconnect on it)."""
        servant: _Disconnectable = {Form.ANY: _AnyPushSupplierServant, Form.STRUCTURED: _StructuredPushSupplierServant,
                                    Form.SEQUENCE: _SequencePushSupplierServant}[self.form]()
        ref = servant._this()  # type: ignore[attr-defined]
        {Form.ANY: lambda: self.proxy.connect_any_push_supplier(ref),
         Form.STRUCTURED: lambda: self.proxy.connect_structured_push_supplier(ref),
         Form.SEQUENCE: lambda: self.proxy.connect_sequence_push_supplier(ref)}[self.form]()
        return servant

    def push_one(self, item: Any) -> None:
        """Push one event (an Any for ANY, a StructuredEvent otherwise; a batch of one for SEQUENCE)."""
        if self.form is Form.ANY:
            self.proxy.push(item)
        elif self.form is Form.STRUCTURED:
            self.proxy.push_structured_event(item)
        else:
            self.proxy.push_structured_events([item])

    def push_all(self, items: Sequence[Any]) -> None:
        """Push every item, in order (sequence suppliers send batches of ``batch_size``)."""
        if self.form is not Form.SEQUENCE:
            for item in items:
                self.push_one(item)
            return
        for start in range(0, len(items), self.batch_size):
            self.proxy.push_structured_events(list(items[start:start + self.batch_size]))


@dataclass
class PullConsumerClient:
    """A pull consumer: connects to a proxy pull supplier and drains it with non-blocking try_pull calls."""

    proxy: Any
    form: Form
    max_number: int = 50

    def connect(self) -> _Disconnectable:
        """Connect a consumer servant (so the channel can call disconnect on it)."""
        servant: _Disconnectable = {Form.ANY: _AnyPullConsumerServant,
                                    Form.STRUCTURED: _StructuredPullConsumerServant,
                                    Form.SEQUENCE: _SequencePullConsumerServant}[self.form]()
        ref = servant._this()  # type: ignore[attr-defined]
        {Form.ANY: lambda: self.proxy.connect_any_pull_consumer(ref),
         Form.STRUCTURED: lambda: self.proxy.connect_structured_pull_consumer(ref),
         Form.SEQUENCE: lambda: self.proxy.connect_sequence_pull_consumer(ref)}[self.form]()
        return servant

    def try_pull(self) -> list[Any]:
        """One non-blocking pull; returns the events obtained (empty if none)."""
        if self.form is Form.ANY:
            value, has = self.proxy.try_pull()
            return [value] if has else []
        if self.form is Form.STRUCTURED:
            value, has = self.proxy.try_pull_structured_event()
            return [value] if has else []
        batch, has = self.proxy.try_pull_structured_events(self.max_number)
        return list(batch) if has else []

    def drain(self, n: int, timeout: float, idle_sleep: float = 0.01) -> list[Any]:
        """Pull until ``n`` events were obtained or ``timeout`` elapsed; returns what was obtained."""
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            batch = self.try_pull()
            got.extend(batch)
            if not batch:
                time.sleep(idle_sleep)
        return got


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` elapsed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def deactivate(servant: Any) -> None:
    """Deactivate an implicitly activated servant in its POA (calls to it then raise OBJECT_NOT_EXIST)."""
    poa = servant._default_POA()
    poa.deactivate_object(poa.servant_to_id(servant))



def unreachable_reference(orb: Any, iface: Any) -> Any:
    """A reference of type ``iface`` (e.g. ``CosNotifyComm.StructuredPushConsumer``) whose endpoint refuses
    connections: every call on it raises TRANSIENT.

    The IOR is built from a corbaloc to a port that was just closed, with its type id replaced by the interface's
    repository id so a server accepts it as a client of that type without asking the (unreachable) object.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    plain = orb.object_to_string(orb.string_to_object(f"corbaloc::127.0.0.1:{port}/Unreachable"))
    body = bytes.fromhex(plain[4:])
    assert body[:12] == b"\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00", "unexpected IOR layout"
    type_id = iface._NP_RepositoryId.encode() + b"\x00"
    type_id += b"\x00" * (-len(type_id) % 4)
    patched = body[:4] + struct.pack("<I", len(iface._NP_RepositoryId) + 1) + type_id + body[12:]
    return orb.string_to_object("IOR:" + patched.hex())._unchecked_narrow(iface)
