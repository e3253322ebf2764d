"""router/cluster/forward.py when PostgreSQL cannot be read (docs/cluster.md, "A node cut from PostgreSQL forwards"):
the owner last read, while that read is at most ``stale_s`` old and named another node whose lease was live; else
the look-up's failure (the activator answers TRANSIENT); never "gone". A failed look-up is not retried for
``DOWN_S``."""

from __future__ import annotations

import pytest

from router.cluster import forward as F
from router.cluster.forward import Forward, Forwarder, OwnerRow


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(F.time, "monotonic", c)
    return c


class Pg:
    """Owner rows; cut (``up`` false), a look-up waits ``wait_s`` (on the test clock) and fails."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[tuple[str, int], OwnerRow | None] = {}
        self.up = True
        self.asked = 0
        self.wait_s = 3.0

    def lookup(self, obj: tuple[str, int]) -> OwnerRow | None:
        self.asked += 1
        if not self.up:
            self.clock.t += self.wait_s
            raise ConnectionError("cut")
        return self.rows.get(obj)


def _forwarder(pg: Pg, stale_s: float = 20.0) -> Forwarder:
    fwd = Forwarder(None)
    fwd.configure("nc", pg.lookup, lambda obj: False)
    fwd.stale_s = stale_s
    return fwd


def test_cut_from_postgres_it_forwards_to_the_owner_it_last_read_for_a_lease_then_fails(clock: Clock) -> None:
    pg = Pg(clock)
    pg.rows[("channel", 1)] = OwnerRow("na", "10.0.0.1:2809", True)
    fwd = _forwarder(pg)
    assert fwd.where(("channel", 1)) == Forward("na", ("10.0.0.1", 2809))
    pg.up = False
    clock.t += 5                                     # past the 1 s cache: a look-up is tried, waits 3 s and fails
    assert fwd.where(("channel", 1)) == Forward("na", ("10.0.0.1", 2809))
    assert fwd.forwarded_stale == 1
    clock.t += 13                                    # 21 s after the read: older than the lease
    with pytest.raises(ConnectionError):
        fwd.where(("channel", 1))
    with pytest.raises(ConnectionError):             # never read: nothing known
        fwd.where(("channel", 2))


def test_a_dead_owner_this_node_or_nobody_last_read_is_not_forwarded_to(clock: Clock) -> None:
    pg = Pg(clock)
    pg.rows[("channel", 1)] = OwnerRow("na", "10.0.0.1:2809", False)     # lease not live
    pg.rows[("channel", 2)] = OwnerRow("nc", "10.0.0.3:2809", True)      # this node's, not loaded
    fwd = _forwarder(pg)
    for cid in (1, 2, 3):                                                  # 3: nobody's (not in the rows)
        fwd.where(("channel", cid))
    pg.up = False
    clock.t += 2
    for cid in (1, 2, 3):
        clock.t += F.DOWN_S + 0.1
        with pytest.raises(ConnectionError):
            fwd.where(("channel", cid))
    assert fwd.forwarded_stale == 0


def test_after_a_look_up_that_waited_and_failed_none_is_tried_for_a_moment(clock: Clock) -> None:
    pg = Pg(clock)
    pg.up = False
    fwd = _forwarder(pg)
    with pytest.raises(ConnectionError):
        fwd.where(("channel", 1))
    with pytest.raises(ConnectionError):
        fwd.where(("bridge", 2))
    assert pg.asked == 1, "the second request did not wait for PostgreSQL again"
    clock.t += F.DOWN_S + 0.1
    pg.wait_s = 0.0                                  # refused at once: no pause after it
    with pytest.raises(ConnectionError):
        fwd.where(("bridge", 2))
    pg.up = True
    assert fwd.where(("bridge", 2)).__class__.__name__ == "Gone" and pg.asked == 3


def test_off_without_a_lease_time(clock: Clock) -> None:
    pg = Pg(clock)
    pg.rows[("channel", 1)] = OwnerRow("na", "10.0.0.1:2809", True)
    fwd = _forwarder(pg, stale_s=0.0)
    fwd.where(("channel", 1))
    pg.up = False
    clock.t += 2
    with pytest.raises(ConnectionError):
        fwd.where(("channel", 1))
