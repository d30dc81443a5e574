"""A drift event's promise (contract section 6, v4: "latched"): once a series' ``drift``
event is out, the series stays in alarm, whatever its effect-size triggers read later,
until a refit of it is published or rejected, or until ``recalibration.retry_after``
passes without ``min_samples`` post-change samples (then a ``rejected`` event with
``reason: "too_few_samples"``). A trigger that fired on a few hundred samples may fall
under its threshold as samples come (the alarm selected a high reading): the event
stream still says what became of the alarm, never drops it silently."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOO_FEW = "too_few_samples"


@dataclass
class Latch:
    triggers: tuple[str, ...] = ()  # what fired when the drift event went out
    since: float | None = None  # when it went out (event time)

    def hold(self, fired: tuple[str, ...]) -> tuple[str, ...]:
        """The triggers the series is in alarm for: those firing now, else the latched."""
        return fired or self.triggers

    def expired(self, now: float, retry_after: float) -> bool:
        """Latched for ``retry_after`` already (the caller checks the samples)."""
        return bool(self.triggers) and self.since is not None and now - self.since >= retry_after

    def as_list(self) -> list[Any]:
        return [list(self.triggers), self.since]

    @classmethod
    def of(cls, value: Any) -> Latch:
        """From ``as_list`` (a state without one: not latched)."""
        if not value:
            return cls()
        triggers, since = value
        return cls(tuple(str(t) for t in triggers), None if since is None else float(since))
