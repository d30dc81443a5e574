"""What a check may skip, and what it reads (issue 39: backtests at replay speed).

A check costs in proportion to the samples labelled since the last one: a series that
gained none is skipped in O(1) (``idle``), and the samples a check copies out of the
rings are counted (``Reads``), so a test can hold the policy to that bound. Refits and
the post-change reads of an alarmed series are the only work that grows with the
buffer.

A caller that knows which series gained samples since its last check (replay does:
the engine's feed says) names them, and ``Untouched`` passes over the others without
even reading their ring totals: a check then costs in proportion to the series that
changed, not to the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from calmon.engine.buffer import SampleSet
from calmon.engine.series import ALL
from calmon.recal.calibrated import SamplesOf
from calmon.recal.state import SeriesState

Key = tuple[str, str]


def quiet(st: SeriesState) -> bool:
    """No label held back, not in alarm, no drift or change time noted: a check of it
    that finds nothing new and the same calibrators does nothing."""
    return (st.held is None and not st.detector.alarmed and not st.drifting
            and st.change_ts is None)


def idle(st: SeriesState | None, total: int, basis: tuple[int | None, int | None]) -> bool:
    """Whether a check of this series would do nothing: it gained no labelled sample
    since its last check (the ring's running total is what it has seen), holds none
    back for an open label, is not in alarm, serves the same calibrators, and its state
    says so already (no drift, no change time). The full path would feed its detector
    nothing and return no event, so skipping it changes no outcome. An alarmed series
    always takes the full path, since its timers (cooldown, retry_after, the latch's
    timeout, held refits, rollbacks) read the clock; so does a new basis (its restart
    reads the ring total of that check)."""
    return st is not None and st.seen == total and st.basis == basis and quiet(st)


class Untouched:
    """The series a check may pass over unread, given what the caller says is new.

    A series is passed over when it was not named new since it was last checked (so
    its ring total is still what its state has seen), its state is quiet after that
    check, and no calibrator was published since (the registry's ``generation``, which
    only an in-memory registry keeps: files may change under a daemon). That is
    exactly ``idle``, decided without the read."""

    def __init__(self) -> None:
        self.pending: set[Key] = set()  # named new and not checked since
        self.busy: set[Key] = set()  # not quiet after their last check
        self.generation: int | None = None  # the registry's at the last check

    def candidates(self, keys: list[Key], new: Iterable[Key] | None,
                   generation: int | None, states: dict[Key, SeriesState]) -> list[Key]:
        """``keys`` less those a check may pass over (all of them when ``new`` is None:
        the caller does not know, or when the registry changed), in their order."""
        got = self.candidate_set(set(keys), new, generation, states)
        return [k for k in keys if k in got]

    def candidate_set(self, keys: set[Key], new: Iterable[Key] | None,
                      generation: int | None, states: dict[Key, SeriesState]) -> set[Key]:
        """``candidates`` as a set, from set operations (a check of a fleet's
        thousands of series then costs no Python pass over them)."""
        last, self.generation = self.generation, (None if new is None else generation)
        if new is None:
            return keys
        self.pending.update(new)
        if generation is None or generation != last:
            return keys
        return ((self.pending | self.busy) & keys) | (keys - states.keys())

    def checked(self, key: Key, st: SeriesState | None) -> None:
        """``key`` went through a check (idle or not) and left ``st``."""
        self.pending.discard(key)
        if st is not None and quiet(st):
            self.busy.discard(key)
        else:
            self.busy.add(key)

    def reset(self) -> None:
        """States replaced from outside a check (restore, forget): check all next."""
        self.generation = None


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


def check_order(key: tuple[str, str]) -> tuple[str, bool, str]:
    """Segments before their model: a segment that drifts alone is handled first."""
    return key[0], key[1] == ALL, key[1]


def lazy_keys(every: set[tuple[str, str]], model: str) -> Callable[[], list[tuple[str, str]]]:
    """All of ``model``'s series in check order, listed only when asked (at a refit)."""
    got: list[list[tuple[str, str]]] = []

    def mine() -> list[tuple[str, str]]:
        if not got:
            got.append(sorted((k for k in every if k[0] == model), key=check_order))
        return got[0]

    return mine
