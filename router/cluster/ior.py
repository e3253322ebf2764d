"""Stringified IORs read and re-addressed (CORBA 3.x part 2, 7.6 and 15.7: the IOR, the IIOP profile body and its
``TAG_ALTERNATE_IIOP_ADDRESS`` components), free of I/O and of the ORB.

A node answers a request for an object another node owns with ``LOCATION_FORWARD`` to that node
(:mod:`router.cluster.forward`): the forward reference is this node's own reference for the object (made by its
POA: the same object key, type id, code sets and ORB components) with its IIOP address replaced by the owner's
and the other nodes' addresses as alternates. omniORBpy has no IOP/IIOP stubs and no IOR-encoding interceptor,
so the few CDR rules an IOR needs (byte order octet, alignment relative to each encapsulation, strings with their
NUL) are here; everything else in a profile (other components, other profile kinds) is copied byte for byte.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["TAG_ALTERNATE_IIOP_ADDRESS", "TAG_INTERNET_IOP", "TAG_MULTIPLE_COMPONENTS", "Address", "IiopProfile",
           "Ior", "IorError", "addresses", "decode", "encode", "retarget"]

TAG_INTERNET_IOP = 0
TAG_MULTIPLE_COMPONENTS = 1
TAG_ALTERNATE_IIOP_ADDRESS = 3

Address = tuple[str, int]          # (host, port)


class IorError(ValueError):
    """The text is not a stringified IOR this module can read."""


@dataclass(frozen=True)
class IiopProfile:
    """A ``TAG_INTERNET_IOP`` profile: version, address, object key, and its tagged components (raw bodies)."""

    major: int
    minor: int
    host: str
    port: int
    key: bytes
    components: tuple[tuple[int, bytes], ...] = ()
    little: bool = False                       # the byte order its encapsulation was written in

    def alternates(self) -> list[Address]:
        return [_alternate(body) for tag, body in self.components if tag == TAG_ALTERNATE_IIOP_ADDRESS]


@dataclass(frozen=True)
class Ior:
    """A decoded IOR: its type id and its profiles, each an :class:`IiopProfile` or ``(tag, raw body)``."""

    type_id: str
    profiles: tuple[IiopProfile | tuple[int, bytes], ...] = field(default_factory=tuple)


# -- CDR, just enough ----------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes) -> None:
        if not data:
            raise IorError("empty encapsulation")
        self.data, self.pos = data, 1
        self.little = bool(data[0] & 1)
        self.order = "<" if self.little else ">"

    def _align(self, n: int) -> None:
        self.pos += (-self.pos) % n

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise IorError("truncated IOR")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def octet(self) -> int:
        return self._take(1)[0]

    def ushort(self) -> int:
        self._align(2)
        return int(struct.unpack(self.order + "H", self._take(2))[0])

    def ulong(self) -> int:
        self._align(4)
        return int(struct.unpack(self.order + "I", self._take(4))[0])

    def octets(self) -> bytes:
        return self._take(self.ulong())

    def string(self) -> str:
        raw = self.octets()
        if not raw or raw[-1] != 0:
            raise IorError("a CDR string without its terminating NUL")
        return raw[:-1].decode("latin-1")


class _Writer:
    def __init__(self, little: bool) -> None:
        self.buf = bytearray([1 if little else 0])
        self.order = "<" if little else ">"

    def _align(self, n: int) -> None:
        self.buf.extend(b"\0" * ((-len(self.buf)) % n))

    def octet(self, v: int) -> None:
        self.buf.append(v)

    def ushort(self, v: int) -> None:
        self._align(2)
        self.buf.extend(struct.pack(self.order + "H", v))

    def ulong(self, v: int) -> None:
        self._align(4)
        self.buf.extend(struct.pack(self.order + "I", v))

    def octets(self, v: bytes) -> None:
        self.ulong(len(v))
        self.buf.extend(v)

    def string(self, v: str) -> None:
        self.octets(v.encode("latin-1") + b"\0")


def _alternate(body: bytes) -> Address:
    r = _Reader(body)
    host = r.string()
    return host, r.ushort()


def _alternate_body(addr: Address, little: bool) -> bytes:
    w = _Writer(little)
    w.string(addr[0])
    w.ushort(addr[1])
    return bytes(w.buf)


def _components(r: _Reader) -> tuple[tuple[int, bytes], ...]:
    return tuple((r.ulong(), r.octets()) for _ in range(r.ulong()))


def _iiop(body: bytes) -> IiopProfile:
    r = _Reader(body)
    major, minor = r.octet(), r.octet()
    host = r.string()
    port = r.ushort()
    key = r.octets()
    comps = _components(r) if (major, minor) >= (1, 1) else ()
    return IiopProfile(major, minor, host, port, key, comps, r.little)


def _iiop_body(p: IiopProfile) -> bytes:
    w = _Writer(p.little)
    w.octet(p.major)
    w.octet(p.minor)
    w.string(p.host)
    w.ushort(p.port)
    w.octets(p.key)
    if (p.major, p.minor) >= (1, 1):
        w.ulong(len(p.components))
        for tag, data in p.components:
            w.ulong(tag)
            w.octets(data)
    return bytes(w.buf)


def decode(text: str) -> Ior:
    """A stringified ``IOR:`` reference (not a corbaloc: resolve those with the ORB first)."""
    if not text[:4].upper() == "IOR:":
        raise IorError("not a stringified IOR (IOR:...)")
    try:
        data = bytes.fromhex(text[4:].strip())
    except ValueError as exc:
        raise IorError(f"not hexadecimal: {exc}") from None
    r = _Reader(data)
    type_id = r.string()
    profiles: list[IiopProfile | tuple[int, bytes]] = []
    for _ in range(r.ulong()):
        tag, body = r.ulong(), r.octets()
        profiles.append(_iiop(body) if tag == TAG_INTERNET_IOP else (tag, body))
    return Ior(type_id, tuple(profiles))


def encode(ior: Ior, *, little: bool = True) -> str:
    w = _Writer(little)
    w.string(ior.type_id)
    w.ulong(len(ior.profiles))
    for p in ior.profiles:
        if isinstance(p, IiopProfile):
            w.ulong(TAG_INTERNET_IOP)
            w.octets(_iiop_body(p))
        else:
            w.ulong(p[0])
            w.octets(p[1])
    return "IOR:" + bytes(w.buf).hex()


def addresses(ior: Ior) -> list[Address]:
    """Every IIOP address the reference names, in the order a client tries them: each IIOP profile's own address
    then its alternates, then the alternates of ``TAG_MULTIPLE_COMPONENTS`` profiles (omniORB puts a corbaloc's
    second and later addresses there)."""
    out: list[Address] = []
    for p in ior.profiles:
        if isinstance(p, IiopProfile):
            out.append((p.host, p.port))
            out.extend(p.alternates())
        elif p[0] == TAG_MULTIPLE_COMPONENTS:
            r = _Reader(p[1])
            out.extend(_alternate(body) for tag, body in _components(r) if tag == TAG_ALTERNATE_IIOP_ADDRESS)
    return out


def retarget(text: str, primary: Address, alternates: Sequence[Address]) -> str:
    """``text`` with the address of its first IIOP profile made ``primary`` and that profile's alternate addresses
    made ``alternates`` (in order, ``primary`` left out); object key, type id and other components unchanged."""
    ior = decode(text)
    profiles = list(ior.profiles)
    for i, p in enumerate(profiles):
        if isinstance(p, IiopProfile):
            if (p.major, p.minor) < (1, 1) and alternates:
                raise IorError("an IIOP 1.0 profile has no components: no alternate addresses")
            alts = [a for a in dict.fromkeys(alternates) if a != primary]
            comps = tuple(c for c in p.components if c[0] != TAG_ALTERNATE_IIOP_ADDRESS) + tuple(
                (TAG_ALTERNATE_IIOP_ADDRESS, _alternate_body(a, p.little)) for a in alts)
            profiles[i] = replace(p, host=primary[0], port=primary[1], components=comps)
            return encode(replace(ior, profiles=tuple(profiles)))
    raise IorError("the reference has no IIOP profile")
