"""Whether the run reads: how long since the last record arrived while the topics hold
records ahead of it. A run that stops reading with records waiting (a stalled fetch,
a partition the broker no longer serves it) is said once a minute in the log and in
/status ``reading``, never left silent."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

IDLE_AFTER_S = 60.0  # no record for this long with records ahead: the run is idle
CHECK_EVERY_S = 5.0  # how often the loop looks (reading the lag may ask the broker)
WARN_EVERY_S = 60.0

Lag = Mapping[tuple[str, int], int]


class ReadWatch:
    """Fed by the loop thread (``saw`` after each poll, ``check`` between polls);
    ``status`` may be read from any thread."""

    def __init__(self, lag: Callable[[], Lag], *, clock: Callable[[], float] = time.monotonic,
                 idle_after_s: float = IDLE_AFTER_S) -> None:
        self.lag = lag
        self.clock = clock
        self.idle_after_s = idle_after_s
        self._read_at = clock()  # the last record (or the start)
        self._checked_at = -float("inf")
        self._warned_at = -float("inf")
        self._ahead = 0  # records ahead, as last checked

    def saw(self, records: int) -> None:
        if records:
            self._read_at = self.clock()
            self._ahead = 0

    def idle_for(self) -> float:
        return max(0.0, self.clock() - self._read_at)

    def check(self) -> None:
        now = self.clock()
        if now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        idle = now - self._read_at
        if idle < self.idle_after_s:
            return
        self._ahead = sum(self.lag().values())
        if self._ahead > 0 and now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("no record read for %.0fs although the topics hold %d records "
                        "ahead of this run: the consumer is stalled (see /status reading "
                        "and calmon_consumer_lag)", idle, self._ahead)

    def status(self) -> dict[str, float | int | bool]:
        """/status ``reading``: seconds since the last record, the records ahead as last
        checked, and whether that makes the run idle."""
        idle = self.idle_for()
        return {"idle_seconds": round(idle, 1), "ahead": self._ahead,
                "idle": idle >= self.idle_after_s and self._ahead > 0}
