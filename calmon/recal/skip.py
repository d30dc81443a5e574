"""What a check may skip, and what it reads (issue 39: backtests at replay speed).

A check costs in proportion to the samples labelled since the last one: a series that
gained none is skipped in O(1) (``idle``), and the samples a check copies out of the
rings are counted (``Reads``), so a test can hold the policy to that bound. Refits and
the post-change reads of an alarmed series are the only work that grows with the
buffer.
"""

from __future__ import annotations

from calmon.engine.buffer import SampleSet
from calmon.recal.calibrated import SamplesOf
from calmon.recal.state import SeriesState


def idle(st: SeriesState | None, total: int, basis: tuple[int | None, int | None]) -> bool:
    """Whether a check of this series would do nothing: it gained no labelled sample
    since its last check (the ring's running total is what it has seen), holds none
    back for an open label, is not in alarm, serves the same calibrators, and its state
    says so already (no drift, no change time). The full path would feed its detector
    nothing and return no event, so skipping it changes no outcome. An alarmed series
    always takes the full path, since its timers (cooldown, retry_after, the latch's
    timeout, held refits, rollbacks) read the clock; so does a new basis (its restart
    reads the ring total of that check)."""
    return (st is not None and st.seen == total and st.held is None and st.basis == basis
            and not st.detector.alarmed and not st.drifting and st.change_ts is None)


class Reads:
    """``samples_of`` that counts the samples it hands out (``n``): what one check read
    from the rings."""

    def __init__(self, samples_of: SamplesOf) -> None:
        self.samples_of = samples_of
        self.n = 0

    def __call__(self, model: str, segment: str, last: int | None) -> SampleSet | None:
        got = self.samples_of(model, segment, last)
        self.n += 0 if got is None else len(got)
        return got
