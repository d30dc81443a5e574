"""A series' samples after its live calibrator: the scoring the policy's detector reads,
and the calibrated windows the exporter and /reliability show (contract section 6:
``calmon_calibrated_ece`` reads only predictions made after the calibrator's
``fitted_at``, never the data it was fit on)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from calmon.calibrators import Calibrator
from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import Bins, bins_from_samples, confidence_and_correct, ece
from calmon.engine.records import SCORE_KINDS
from calmon.engine.windows import in_window
from calmon.recal.refit import apply_or_identity, input_kind, scores_as
from calmon.recal.registry import Live

# (model, segment, last) -> a copy of the newest ``last`` samples (all when None) of a
# series' ring, with the ring's running total; None when the series has no ring.
SamplesOf = Callable[[str, str, int | None], SampleSet | None]


def read_once(samples_of: SamplesOf) -> SamplesOf:
    """``samples_of`` as one state of each ring for a whole check: every read of the
    check (the running total, what is new, the post-change samples, a refit's, the
    calibrated windows) is a tail of the ring as it stood at the check's first read of
    it, however the engine feeds meanwhile. A ring is copied only as far back as a read
    asks (the total alone copies nothing, the new samples only themselves), so a check
    costs in proportion to what is new; a read further back (an alarm's refit) copies
    the ring once more and drops what arrived since the first read."""
    sets: dict[tuple[str, str], tuple[SampleSet | None, bool]] = {}

    def once(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        key = (model, segment)
        if key not in sets:
            got = samples_of(model, segment, last)
            # complete: the copy holds the whole ring (it asked all, or got less)
            sets[key] = (got, got is None or last is None or len(got) < last)
        have, complete = sets[key]
        if have is None:
            return None
        if not complete and (last is None or last > len(have)):
            sets[key] = further(model, segment, have, last)
            have = sets[key][0] or have
        return have if last is None else have.tail(last)

    def further(model: str, segment: str, have: SampleSet,
                last: int | None) -> tuple[SampleSet | None, bool]:
        """The newest ``last`` samples as of ``have.total``: asked again for as many more
        as arrived since, then cut back to that state."""
        want = last
        while True:
            got = samples_of(model, segment, want)
            if got is None:
                return None, True
            since = got.total - have.total  # arrived after the check's first read
            exhausted = want is None or len(got) < want
            if since <= 0 or exhausted or want >= last + since:  # type: ignore[operator]
                cut = got.head(len(got) - since) if since > 0 else got
                return cut, exhausted
            want = last + since  # type: ignore[operator]

    return once


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: Any) -> float | None:
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC).timestamp()
    except ValueError:
        return None


def target(cal: Calibrator | None, samples: SampleSet) -> tuple[np.ndarray, np.ndarray]:
    """(p, y) the detector tests: calibrated P(y=1) and y, or top-label confidence and
    correctness, after ``cal`` (identity when None)."""
    return confidence_and_correct(*scored(cal, samples))


def scored(cal: Calibrator | None, samples: SampleSet) -> tuple[np.ndarray, np.ndarray]:
    """(calibrated probabilities, integer labels) of the samples after ``cal``."""
    kinds = samples.kind
    if len(kinds) and (kinds == kinds[0]).all():  # one kind (the usual): no conversion
        kind, given = SCORE_KINDS[int(kinds[0])], samples.score.astype(np.float64)
    else:  # what input_kind and scores_as decide for a mix
        kind = input_kind(samples)
        given = scores_as(samples, kind)
    probs = apply_or_identity(cal, given, kind)
    return probs, samples.label.astype(np.int64)


def calibrated_windows(cfg: Config, live_of: Callable[[str, str], Live | None],
                       now: float | Callable[[str], float],
                       series: Iterable[tuple[str, str]], samples_of: SamplesOf, *,
                       identity: bool = False,
                       on_error: Callable[[str, str], None] | None = None
                       ) -> list[CalibratedWindow]:
    """Per series and window (ending at ``now``, or at ``now(model)``), the bins of
    the buffered samples after the live calibrator, predicted after its
    ``fitted_at`` only. With ``identity``, a series without a calibrator is scored
    as given on every buffered sample of the window (what its calibrated ECE is);
    otherwise it is left out. A series that raises is skipped (``on_error`` is told,
    inside the ``except``): one series' trouble never stops the others' readings."""
    now_of = now if callable(now) else (lambda _model, t=now: t)
    out: list[CalibratedWindow] = []
    for model, segment in sorted(set(series)):
        t_now = now_of(model)
        if not math.isfinite(t_now):
            continue
        try:
            out += _windows_of(cfg, live_of(model, segment), model, segment, t_now,
                               samples_of, identity)
        except Exception:
            if on_error is None:
                raise
            on_error(model, segment)
    return out


def _windows_of(cfg: Config, live: Live | None, model: str, segment: str, t_now: float,
                samples_of: SamplesOf, identity: bool) -> list[CalibratedWindow]:
    if live is None and not identity:
        return []
    samples = samples_of(model, segment, None)
    if samples is None:
        return []
    if live is None:
        fresh = np.ones(len(samples), dtype=bool)
    else:
        fitted = parse_iso(live.doc.get("fitted_at"))
        fresh = samples.ts > (fitted if fitted is not None else math.inf)
    out = []
    for w in cfg.metrics.windows:
        mask = fresh & in_window(samples.ts, w.seconds, t_now)
        n = int(mask.sum())
        b = None
        if n:
            p, y = target(None if live is None else live.calibrator, samples.select(mask))
            b = bins_from_samples(p, y, cfg.metrics.bins)
        out.append(CalibratedWindow(model, segment, w.name, b, n, live is not None))
    return out


@dataclass(frozen=True)
class CalibratedWindow:
    """A series' window after its live calibrator (``calibrated``; else the identity)."""

    model: str
    segment: str
    window: str
    bins: Bins | None  # None when no sample qualifies
    samples: int
    calibrated: bool

    @property
    def ece(self) -> float | None:
        b = self.bins
        return None if b is None else ece(b.count, b.conf, b.correct)


CalibratedRow = tuple[str, str, str, float | None, int]  # model, segment, window, ECE, n


def readings(windows: list[CalibratedWindow]
             ) -> tuple[list[CalibratedRow], dict[tuple[str, str, str], Bins]]:
    """What a check leaves for the readers: the (model, segment, window, ECE, samples)
    rows, and the diagrams of the windows that went through a live calibrator."""
    rows = [(c.model, c.segment, c.window, c.ece, c.samples) for c in windows]
    bins = {(c.model, c.segment, c.window): c.bins for c in windows
            if c.calibrated and c.bins is not None}
    return rows, bins


def concat(a: SampleSet | None, b: SampleSet | None) -> SampleSet | None:
    """``a`` then ``b`` (the held samples before the fresh ones); of another class
    count, ``b`` alone."""
    if a is None or len(a) == 0:
        return b
    if b is None or len(b) == 0 or a.score.shape[1:] != b.score.shape[1:]:
        return a if b is None or len(b) == 0 else b  # another K: the held ones go
    return SampleSet(np.concatenate((a.ts, b.ts)), np.concatenate((a.label, b.label)),
                     np.concatenate((a.kind, b.kind)), np.concatenate((a.score, b.score)),
                     b.total)
