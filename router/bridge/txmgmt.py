"""BridgeTransactionMgmt::TransactionManagement of a bridge (NJI 2.7.6.2, 3.2.1), mixed into ``BridgeImpl``.

Channel → JMS (this module): routing transactions need the channel to PUSH to the bridge (NJI 2.7.2), on a node
with T2 (``runtime.t2``). ``enable_transaction(events, timeout)``:

* raises ``UnsupportedTransaction`` for ``events`` = 0, for a bridge whose channel endpoint is PULL (the bridge
  would be the transaction client, which NJI 2.7.4 forbids), on a node without T2, and when the bridge's proxy
  refuses ``EnableTransaction`` = TRUE (its channel is BestEffort: NJI 2.7.6.1 needs Persistent);
* raises ``TransactionAlreadyActive`` while routing transactions are enabled on the bridge (a transactional
  association exists; ``disable_transaction`` first to change the values);
* otherwise stores ``tx_events``/``tx_timeout`` in the bridge's row (first: a store failure changes nothing), then
  writes ``EnableTransaction`` = TRUE (which makes both reliabilities of the proxy Persistent) and
  ``TransactionEvents`` (structured) or ``TransactionEventSequences`` (sequence) = ``events`` and
  ``TransactionTimeout`` = ``timeout`` seconds on the bridge's channel-side proxy (``extra["transaction"]``,
  stored with the proxy). From then on the proxy delivers every batch in a T2 (router.channel.txdelivery).

``disable_transaction()``: while a T2 of the bridge is in progress it raises ``TransactionActive`` and the disable
takes effect as soon as the T2s in progress end (no further T2 starts: while the disable is pending the bridge's
``OutboundT2`` refuses a new T2 as an outage, so a backlog cannot keep the bridge busy for ever); otherwise at
once: ``EnableTransaction`` = FALSE on the proxy (both its reliabilities BestEffort, as
NJI 2.7.6.1 says; the channel's reliabilities, which decide persistence, are unchanged) and the stored values
cleared. It also clears an ``EnableTransaction`` the proxy inherited from its channel or admin. Without
transactions enabled it does nothing.

JMS → channel: the same properties are written on the bridge's channel-side pull proxy consumer, which runs the T2s
(router.channel.t2in; the channel must PULL from the bridge, NJI 2.7.2: a push sender gets
``UnsupportedTransaction``). ``disable_transaction`` during a T2 of that proxy writes EnableTransaction = FALSE at
once (the proxy reads it before its next T2, so it takes effect when the current one ends) and raises
``TransactionActive``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from omniORB import CORBA

import CosNotification

from idl.generated import BridgeTransactionMgmt as BTM
from router.corbacall import CHANNEL, CallFailed, call
from router.routing.qos import ENABLE_TRANSACTION

__all__ = ["TransactionMgmtMixin"]

log = logging.getLogger("nsjms.bridge")


class TransactionMgmtMixin:
    """enable/disable_transaction (see the module docstring). Needs the BridgeImpl attributes used below."""

    id: int
    rt: Any
    row: Any
    _lock: threading.RLock
    to_jms_direction: bool
    tx_events: int
    tx_timeout: int
    t2_out: Any
    _disable_pending = False

    def _save_settings(self, **extra: Any) -> None:
        raise NotImplementedError

    def _proxy_servant(self) -> Any:
        raise NotImplementedError

    def _kind(self) -> str:
        raise NotImplementedError

    # -- IDL ----------------------------------------------------------------------------------------------------
    def enable_transaction(self, events: int, timeout: int) -> None:
        with self._lock:
            if self.tx_events:
                raise BTM.TransactionAlreadyActive()
            self._check(events)
            self._save_settings(tx_events=int(events), tx_timeout=int(timeout))   # stored first, then in effect
            self.tx_events, self.tx_timeout = int(events), int(timeout)
            self._disable_pending = False
            try:
                self._write_proxy(True)
            except CosNotification.UnsupportedQoS as exc:
                log.warning("bridge %d: the channel refuses EnableTransaction on the bridge's proxy: %s", self.id,
                            exc)
                self._save_settings(tx_events=0, tx_timeout=0)
                self.tx_events, self.tx_timeout = 0, 0
                raise BTM.UnsupportedTransaction() from None
        log.info("bridge %d: routing transactions enabled (%d %s per transaction, timeout %d s)", self.id, events,
                 "sequences" if self._kind() == "SEQUENCE" else "events", timeout)

    def disable_transaction(self) -> None:
        with self._lock:
            if not self.tx_events and not self._proxy_enabled():
                return
            if not self.to_jms_direction:
                # The channel's pull proxy reads EnableTransaction before each T2 (once a message is there, after
                # it marked itself active): written now, it takes effect when the T2 in progress (if any) ends,
                # which is then reported as TransactionActive. Read AFTER the write: a round that read the old
                # value is active by then (router.channel.t2in.InboundT2Driver.round).
                self._apply_disable()
                active = self._inbound_active()
                if active:
                    log.info("bridge %d: disable_transaction during a routing transaction: takes effect when it "
                             "ends", self.id)
                    raise BTM.TransactionActive()
                return
            self._disable_pending = True
            if self.t2_out is not None and self.t2_out.active():
                log.info("bridge %d: disable_transaction during a routing transaction: takes effect when it ends",
                         self.id)
                raise BTM.TransactionActive()
            self._apply_disable()

    # -- outbound -----------------------------------------------------------------------------------------------
    def transaction_enabled(self) -> bool:
        return bool(self.tx_events)

    def _proxy_enabled(self) -> bool:
        """EnableTransaction as the bridge's proxy has it (also inherited from its channel or admin)."""
        try:
            return bool(self._checked_servant().qos.get(ENABLE_TRANSACTION, False))
        except CallFailed:
            return False

    def _checked_servant(self) -> Any:
        """:meth:`_proxy_servant` through the node's boundary for outgoing CORBA calls (router.corbacall): its
        CORBA exceptions (the proxy or the channel gone) come back as :class:`~router.corbacall.CallFailed`."""
        return call(self, "_proxy_servant", policy=CHANNEL)

    def _check(self, events: int) -> None:
        """UnsupportedTransaction unless this bridge can run T2s: channel PUSH → JMS (``t2_out``) or JMS → channel
        PULL (the channel's pull proxy drives them, router.channel.t2in), on a node with T2, and a proxy that
        accepts EnableTransaction (a Persistent channel)."""
        if self.to_jms_direction:
            usable = self.t2_out is not None
        else:
            usable = getattr(self.rt, "t2", None) is not None and self.supports_transaction()
        if events < 1 or not usable:
            raise BTM.UnsupportedTransaction()
        problem = self._two_phase_problem()
        if problem is not None:   # checked at start too; a PostgreSQL restarted with 0 since is refused here
            log.warning("bridge %d: routing transactions refused: %s", self.id, problem)
            raise BTM.UnsupportedTransaction()
        try:
            self._proxy_servant().validate_qos([_enable_property(True)])
        except CosNotification.UnsupportedQoS:
            raise BTM.UnsupportedTransaction() from None

    def _two_phase_problem(self) -> str | None:
        """Why the node's PostgreSQL cannot prepare a T2's branch (``max_prepared_transactions`` = 0), or None;
        None too when it cannot be asked (the store boundary reports that on the next write)."""
        from router.db.twophase import prepared_transactions_problem

        db = getattr(getattr(self, "rt", None), "db", None)   # a host without a node runtime: nothing to ask
        if db is None:
            return None
        try:
            with db.unit_of_work() as conn:
                row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
        except Exception:  # noqa: BLE001 — only a precheck: the store's own errors surface where they belong
            return None
        return None if row is None else prepared_transactions_problem(int(row[0]))

    def _write_proxy(self, enable: bool) -> None:
        servant = self._proxy_servant()
        servant.set_qos([_enable_property(enable)])
        key = "sequences" if self._kind() == "SEQUENCE" else "events"
        servant.save_extra(transaction={key: self.tx_events, "timeout": self.tx_timeout} if enable else None)

    def _apply_disable(self) -> None:
        """Under ``_lock``: stored first, then the proxy."""
        self._save_settings(tx_events=0, tx_timeout=0)
        self.tx_events, self.tx_timeout = 0, 0
        self._disable_pending = False
        try:
            call(self, "_write_proxy", False, policy=CHANNEL)
        except CallFailed as exc:              # the proxy is gone (channel destroyed): nothing delivers in T2
            log.warning("bridge %d: could not clear EnableTransaction on its proxy: %s", self.id, exc)
        log.info("bridge %d: routing transactions disabled", self.id)

    def _t2_idle(self) -> None:
        """OutboundT2.on_idle: the bridge's last T2 ended; a pending disable takes effect now."""
        if not self._disable_pending:
            return
        with self._lock:
            if self._disable_pending and (self.tx_events or self._proxy_enabled()):
                try:
                    self._apply_disable()
                except Exception:
                    # no longer pending: the bridge's T2s start again (a pending disable refuses them) until the
                    # operator's next disable_transaction
                    self._disable_pending = False
                    log.exception("bridge %d: the pending disable_transaction failed; routing transactions stay "
                                  "enabled, call it again", self.id)

    # -- inbound (JMS → channel) ------------------------------------------------------------------------------
    def supports_transaction(self) -> bool:
        raise NotImplementedError

    def _inbound_active(self) -> bool:
        """A T2 of the channel's pull proxy with this bridge is in progress."""
        try:
            driver = getattr(self._checked_servant(), "_t2", None)
        except CallFailed:
            return False
        return bool(getattr(driver, "active", False))

    def transaction_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transaction_events": self.tx_events}
        if self.tx_events:
            out["transaction_timeout"] = self.tx_timeout
        if self._disable_pending:
            out["transaction_disable_pending"] = True
        if self.t2_out is not None:
            out.update(self.t2_out.status())
        return out


def _enable_property(value: bool) -> Any:
    return CosNotification.Property(ENABLE_TRANSACTION, CORBA.Any(CORBA.TC_boolean, value))
