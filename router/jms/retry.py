"""The reconnect policy of both transports: named, bounded, jittered retries that a shutdown event interrupts."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import tenacity

from router.jms.errors import BrokerUnavailable

__all__ = ["RECONNECT_POLICY", "RetryPolicy"]

log = logging.getLogger("nsjms.transport")


@dataclass(frozen=True)
class RetryPolicy:
    """A named, bounded, jittered retry policy, interruptible by a shutdown event (tenacity underneath)."""

    name: str
    max_attempts: int
    max_total_s: float
    initial_wait_s: float
    max_wait_s: float

    def retrying(self, shutdown: threading.Event, *,
                 retry_on: tuple[type[BaseException], ...] = (BrokerUnavailable,)) -> tenacity.Retrying:
        """A ``tenacity.Retrying``: stops after ``max_attempts``, ``max_total_s`` or when ``shutdown`` is set;
        sleeps on ``shutdown.wait`` so setting it ends the wait at once; re-raises the last error."""
        def sleep(seconds: float) -> None:
            shutdown.wait(seconds)

        return tenacity.Retrying(
            stop=(tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_total_s)
                  | tenacity.stop_when_event_set(shutdown)),
            wait=tenacity.wait_random_exponential(multiplier=self.initial_wait_s, max=self.max_wait_s),
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=sleep, reraise=True, before_sleep=self._log_retry)

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("retry policy %s: attempt %d failed (%s); retrying", self.name, state.attempt_number, exc)


#: Reconnecting to the broker: up to 12 attempts within 60 s, waits 0.2 s .. 5 s with full jitter.
RECONNECT_POLICY = RetryPolicy("transport.reconnect", max_attempts=12, max_total_s=60.0,
                               initial_wait_s=0.2, max_wait_s=5.0)
