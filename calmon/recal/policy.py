"""The recalibration policy: detection, refits and the publish gate as one pure step.

``Policy.check(now, series, samples_of)`` is what runs every ``recalibration.interval``:
the daemon's APScheduler job calls it on the engine's event time, and
``calmon replay --recalibrate`` calls it on the files' event time, so a backtest runs
exactly the daemon's code. It takes samples and a clock and returns events; its only
side effect is publishing through the registry it was given.

Per series (a model's ``__all__``, and each segment with ``per_segment``):

1. the series' e-detector (calmon.recal.detect) is fed the samples joined since the
   last check, scored after the live calibrator and placed by their prediction time;
   it restarts whenever the live calibrator changes (a new null) and then reads only
   predictions made after its ``fitted_at``. Its threshold is 1 / (alpha / S), S the number of
   series the model can have, so all of a calibrated model's series together raise a
   false alarm with probability at most alpha between two refits, however long it runs;
2. once it alarms, the change time is estimated (CUSUM start, in prediction time) and
   the effect-size triggers read the samples since then: the first trigger to fire
   makes the alarm's one ``drift`` event;
3. outside the cooldown, with at least ``min_samples`` post-change samples (every
   buffered sample predicted since the change, whatever its label delay or the
   window), those samples alone are refitted (calmon.recal.refit) and published only
   through the gate; a rejection is retried once they have doubled or after
   ``retry_after``, whichever comes first. Only their newest regime is fitted when the
   stream changed again since (calmon.recal.regime); a series that alternates is judged
   and fitted on a full cycle instead (calmon.recal.cycle).
   A segment's calibrator is shrunk toward the model's; a model-level refit is not
   published when it makes a segment with ``min_samples`` samples significantly worse.

One failing series (an OSError, a fit that raises) is a ``failed`` event for that
series only.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from calmon.calibrators.scores import to_logits
from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import (
    bins_from_samples,
    confidence_and_correct,
)
from calmon.engine.series import ALL
from calmon.engine.windows import in_window
from calmon.errors import NotOwnerError, describe

# CalibratedRow, CalibratedWindow, parse_iso, readings and target are re-exported
from calmon.recal.calibrated import CalibratedRow as CalibratedRow
from calmon.recal.calibrated import CalibratedWindow as CalibratedWindow
from calmon.recal.calibrated import SamplesOf, calibrated_windows, concat, iso, read_once, scored
from calmon.recal.calibrated import parse_iso as parse_iso
from calmon.recal.calibrated import readings as readings
from calmon.recal.calibrated import target as target
from calmon.recal.cycle import Cycles, block, cycle_samples
from calmon.recal.detect import BLOCK, MAX_GRID, Detector, fit_start, tilt_log_lr
from calmon.recal.guards import deferred, segment_guards
from calmon.recal.hold import ScoresOf, moved
from calmon.recal.latch import TOO_FEW, Latch
from calmon.recal.ratios import SharedRatios
from calmon.recal.refit import (
    Guard,
    Prior,
    Refit,
    input_kind,
    platt_form,
    refit,
    scores_as,
)
from calmon.recal.regime import newest
from calmon.recal.registry import Live, Registry
from calmon.recal.rollback import best_rollback, rollback_document
from calmon.recal.said import evidence
from calmon.recal.skip import Reads, Untouched, check_order, idle, lazy_keys
from calmon.recal.state import Event as Event  # re-exported: its old place
from calmon.recal.state import Gauges, gauges_of
from calmon.recal.state import SeriesState as SeriesState  # re-exported: its old place
from calmon.recal.triggers import Decision, Reading, baseline, decide, worst_class_ece

log = logging.getLogger(__name__)

FIRST_FEED = 10_000  # samples a series' detector starts on (bounds the first check's cost)
MIN_READ = 200  # the triggers read at least this many post-change samples
MIN_ROLLBACK = 50  # post-change samples a rollback needs at least
SHRINK = 5.0  # prior weight of the model's (a, b) in a segment fit, in samples


class Policy:
    def __init__(self, cfg: Config, registry: Registry) -> None:
        self.cfg = cfg
        self.rc = cfg.recalibration
        self.registry = registry
        self.states: dict[tuple[str, str], SeriesState] = {}
        self.published_ece: dict[tuple[str, str], float] = {}
        # (model, segment) -> the live version a class reset set aside: it and older
        # ones scored the old class count, so they are not served until a newer one
        self.set_aside: dict[tuple[str, str], int] = {}
        self.errors = 0  # series whose calibrated windows raised (counted, skipped)
        self._logged: set[tuple[str, str]] = set()  # each series' first raise is logged
        self.gauges = Gauges()
        self.scores_of: ScoresOf | None = None  # newer predictions' scores, for holds
        self.cycles = Cycles(registry)  # which series alternate (calmon.recal.cycle)
        self._snapshot: dict[str, Any] = {"series": [], "published_ece": [], "set_aside": []}
        self._lock = threading.Lock()  # one check at a time
        self.samples_read = 0  # samples the last check copied out of the rings
        # series checked past the idle test since readers were last published
        self._touched: set[tuple[str, str]] = set()
        self._snaps: dict[tuple[str, str], tuple[SeriesState, dict[str, Any]]] = {}
        self._untouched = Untouched()  # which series a check may pass over unread
        # replay reads the readers' view only at its ends: it publishes it then
        self.readers_each_check = True
        self._ratios = SharedRatios()

    # ------------------------------------------------------------ budget

    def series_budget(self) -> int:
        """How many series one model can have: the alpha split's denominator. Fixed by
        the config (not by the series seen so far), so the split is valid up front."""
        if not self.rc.per_segment:
            return 1
        total = 1
        for keys in self.cfg.segments.slices:
            total += (self.cfg.segments.max_values + 1) ** len(keys)
        return total

    def log_threshold(self) -> float:
        return math.log(self.series_budget() / self.rc.alpha)

    # ------------------------------------------------------------ one check

    def check(self, now: float, series: Iterable[tuple[str, str]],
              samples_of: SamplesOf) -> list[Event]:
        """One check of ``series`` on one clock (replay's and the tests' form)."""
        return self.check_each(lambda _model: now, series, samples_of)

    def check_each(self, now_of: Callable[[str], float], series: Iterable[tuple[str, str]],
                   samples_of: SamplesOf, *,
                   new: Iterable[tuple[str, str]] | None = None) -> list[Event]:
        """One check of every model in ``series`` on its own event time, ``now_of(model)``
        (contract §2: no model's records move another's clock, hence its holds,
        cooldowns and windows); a model whose time is unknown waits. Each series' ring
        is read once, whole (``read_once``): every read of the check is a tail of it.
        ``new``: the series that may have gained samples since the previous call (None:
        unknown); a series outside it that a check would find idle is passed over
        without a read (calmon.recal.skip.Untouched)."""
        samples_of = read_once(samples_of)
        with self._lock:
            samples_of = reads = Reads(samples_of)
            every = set(series)
            keys = sorted(self._untouched.candidate_set(every, new, self.registry.generation,
                                                        self.states), key=check_order)
            events: list[Event] = []
            for model, group in itertools.groupby(keys, key=lambda k: k[0]):
                now = now_of(model)
                if math.isfinite(now):
                    events += self._check_model(now, list(group), lazy_keys(every, model),
                                                samples_of)
            self.samples_read = reads.n
            if self.readers_each_check:
                self._publish_readers()
            return events

    def _check_model(self, now: float, keys: list[tuple[str, str]],
                     mine: Callable[[], list[tuple[str, str]]],
                     samples_of: SamplesOf) -> list[Event]:
        """``keys``: the model's series to check; ``mine()``: all of them (what a
        model-level refit looks at)."""
        events: list[Event] = []
        self._ratios = SharedRatios()  # the model's __all__ reads its segments' ratios
        for model, segment in keys:
            try:
                events += self._check_series(now, model, segment, mine, samples_of)
                self._untouched.checked((model, segment), self.states.get((model, segment)))
            except Exception as e:  # one series' trouble never stops the others
                self._touched.add((model, segment))
                self._untouched.checked((model, segment), None)
                if isinstance(e, NotOwnerError):  # a rebalance moved it: no traceback
                    log.info("recalibration of %r/%r left to its new owner: %s",
                             model, segment, e)
                else:
                    log.exception("recalibration of %r/%r failed", model, segment)
                st = self.states.get((model, segment))
                if st is not None:
                    st.last_refit = now
                events.append(Event(now, model, segment, "failed",
                                    {"method": self.rc.method, "trigger": None,
                                     "fit_samples": 0, "holdout_samples": 0,
                                     "reason": describe(e)[:200]}))
        return events

    def live(self, model: str, segment: str) -> Live | None:
        live = self._served(model, segment)
        if live is None and segment != ALL:
            live = self._served(model, ALL)  # a segment falls back to the model's
        return live

    def is_aside(self, key: tuple[str, str], version: int) -> bool:
        """Whether a class reset set this live version of the series aside."""
        aside = self.set_aside.get(key)
        return aside is not None and version <= aside

    def _served(self, model: str, segment: str) -> Live | None:
        """The series' own live calibrator, unless a class reset set it aside."""
        live = self.registry.live(model, segment)
        return None if live is None or self.is_aside((model, segment), live.version) else live

    def _basis(self, model: str, segment: str) -> tuple[int | None, int | None]:
        own = self._served(model, segment)
        model_live = None if segment == ALL else self._served(model, ALL)
        return (None if own is None else own.version,
                None if model_live is None else model_live.version)

    def _hold(self) -> float:
        """How long a prediction's label stays open: ``join.missing_label.after`` (its
        implicit negative comes then), else 0 (labels arrive whatever their value)."""
        ml = self.cfg.join.missing_label
        return 0.0 if ml is None else float(ml.after)

    def _spacing(self, span: float = 0.0) -> float:
        """The detector's grid of candidate change times (the change time is estimated
        to that resolution near now; older points are thinned with age and reach back
        to the restart): one a check, and at least 1/256 of the window; at first sight
        also wide enough for the buffered samples' ``span`` to be opened at once
        (``MAX_GRID`` points)."""
        return max(float(self.rc.interval), self.cfg.window(self.rc.window).seconds / 256,
                   span / (MAX_GRID - 2 * BLOCK))

    def _check_series(self, now: float, model: str, segment: str,
                      keys: Callable[[], list[tuple[str, str]]],
                      samples_of: SamplesOf) -> list[Event]:
        head = samples_of(model, segment, 0)
        if head is None or head.total == 0:
            return []
        live = self.live(model, segment)
        basis = self._basis(model, segment)
        st = self.states.get((model, segment))
        if idle(st, head.total, basis):  # nothing new: O(1)
            return []
        self._touched.add((model, segment))  # its readers' snapshot is taken again
        first = None
        if st is None:  # first sight: the newest buffered samples are new (at most
            # FIRST_FEED, chosen by position only, so the test stays valid)
            start = max(0, head.total - FIRST_FEED)
            first = samples_of(model, segment, head.total - start)
            span = 0.0 if first is None or not len(first) else now - float(first.ts.min())
            st = self.states[(model, segment)] = SeriesState(
                Detector.new(None, self._spacing(span)), basis, start, start)
        elif st.basis != basis:  # a new live calibrator: a new null, a new test, on
            # predictions made after it was fitted only
            fitted = None if live is None else parse_iso(live.doc.get("fitted_at"))
            st = self.states[(model, segment)] = SeriesState(
                Detector.new(fitted, self._spacing()), basis, head.total, head.total,
                last_refit=st.last_refit)
        self._feed(now, model, segment, st, live, head.total, first, samples_of)
        if not st.detector.alarmed:
            st.drifting, st.change_ts = (), None
            return []
        st.change_ts = st.detector.change_ts()
        decision, post = self._effects(now, model, segment, st, live, samples_of)
        events: list[Event] = []
        if decision.fired and not st.announced:  # one drift event per alarm
            st.announced, st.latch = True, Latch(decision.fired, now)
            events.append(Event(now, model, segment, "drift",
                                {"trigger": decision.fired[0], "change_ts": st.change_ts}))
        fired = st.drifting = st.latch.hold(decision.fired)
        if not fired:
            return events
        if st.rejections:  # after a rejection: again once the evidence has doubled, or
            # after retry_after at the latest, so an alarm never stays latched idle
            cooled = len(post) >= 2 * st.last_n or (
                st.last_refit is None or now - st.last_refit >= self.rc.retry_after)
        else:
            cooled = st.last_refit is None or now - st.last_refit >= self.rc.cooldown
        cycle = self._cycle(model, segment) if cooled else None
        if cycle is not None:  # alternating: judged and fitted on a cycle, not one phase
            post = cycle_samples(samples_of(model, segment, None) or post, now - self._hold(),
                                 cycle)
        if cooled:  # the identity and earlier versions first: no min_samples for them
            undo = self._rollback(now, model, segment, st, post, samples_of)
            if undo is not None:
                events.append(undo)
                return events
        if cooled and len(post) >= self.rc.min_samples and not (self._deferred(
                model, segment, keys()) and not st.latch.expired(now, self.rc.retry_after)):
            events.append(self._refit(now, model, segment, st, post, live,
                                      fired[0], keys(), samples_of, cycle))
        elif len(post) < self.rc.min_samples and st.latch.expired(now, self.rc.retry_after):
            log.info("alarm of %r/%r released: %d post-change samples after retry_after, "
                     "%d needed", model, segment, len(post), self.rc.min_samples)
            events.append(Event(now, model, segment, "rejected", {
                "method": self.rc.method, "trigger": st.latch.triggers[0], "fit_samples": 0,
                "holdout_samples": 0, "reason": TOO_FEW, "post_change_samples": len(post)}))
            st.latch = Latch()
        return events

    def _feed(self, now: float, model: str, segment: str, st: SeriesState, live: Live | None,
              total: int, first: SampleSet | None, samples_of: SamplesOf) -> None:
        """The detector reads the samples joined since the last check (``first`` at first
        sight), scored after the live calibrator, by prediction time."""
        cal = None if live is None else live.calibrator
        new = total - st.seen
        # at first sight the newest samples were just read: the same ones, not again
        fresh = first or (samples_of(model, segment, new) if new > 0 else None)
        if fresh is not None:
            st.seen = fresh.total
        batch = concat(st.held, fresh)
        if batch is not None and len(batch):
            # with implicit negatives, a recent prediction's label is still open (a
            # positive may come, its 0 has not): read only predictions whose label is
            # settled, else which samples arrive would depend on their labels
            due = batch.ts <= now - self._hold()
            st.held = None if due.all() else batch.select(~due)
            ready = batch if st.held is None else batch.select(due)  # (no copy of all)
            if len(ready):
                probs, labels = scored(cal, ready)
                p, y = confidence_and_correct(probs, labels)
                # by prediction time: the detector's grid places each sample by its ts
                st.detector.update(p, y, self.log_threshold(), tilt_log_lr(probs, labels),
                                   ts=ready.ts, now=now - self._hold(),
                                   ll=self._ratios.of(p, y, cal, segment == ALL))

    def _cycle(self, model: str, segment: str) -> float | None:
        """The cycle's length, ``recalibration.window``, when the series alternates
        (calmon.recal.cycle), else None."""
        cyclic = self.cycles.cyclic(model, segment)
        return self.cfg.window(self.rc.window).seconds if cyclic else None

    def _post_change(self, now: float, model: str, segment: str, st: SeriesState,
                     samples_of: SamplesOf) -> SampleSet | None:
        """Every buffered sample predicted at or after the estimated change (and after
        the detector's origin: the live calibrator's fit), whatever its label delay and
        whatever ``recalibration.window``: what ``min_samples`` counts and a refit fits."""
        every = samples_of(model, segment, None)
        if every is None:
            return None
        since = max(x for x in (st.change_ts, st.detector.origin, st.regime_from, -math.inf)
                    if x is not None)
        settled = every.ts <= now - self._hold()
        span = st.detector.change_set()
        if span is not None:  # as late in the change time's confidence set as leaves
            # min_samples: with few positives the point estimate can lie hours early
            since = fit_start(every.ts[settled], since, span[1], self.rc.min_samples)
        return every.select((every.ts >= since) & settled)

    def _effects(self, now: float, model: str, segment: str, st: SeriesState,
                 live: Live | None, samples_of: SamplesOf) -> tuple[Decision, SampleSet]:
        """The effect-size triggers on the post-change samples predicted inside
        ``recalibration.window`` (the newest ``MIN_READ`` post-change ones when the
        window holds fewer, as under label delay), and all post-change samples."""
        post = self._post_change(now, model, segment, st, samples_of)
        if post is None or len(post) == 0:
            return Decision(0.0, (), None), SampleSet(*(np.zeros(0),) * 4)
        read = in_window(post.ts, self.cfg.window(self.rc.window).seconds, now)
        if int(read.sum()) < min(MIN_READ, len(post)):
            read = post.ts >= np.sort(post.ts)[-min(MIN_READ, len(post))]
        probs, labels = scored(None if live is None else live.calibrator, post.select(read))
        p, y = confidence_and_correct(probs, labels)
        classwise = (worst_class_ece(probs, labels, self.cfg.metrics.bins, self.rc.alpha)[0]
                     if self.cfg.metrics.classwise and probs.ndim == 2 else None)
        reading = Reading(bins_from_samples(p, y, self.cfg.metrics.bins), post.score.ndim == 1,
                          baseline(live, self.published_ece.get((model, segment))), classwise)
        return decide(self.rc, reading), post

    def _deferred(self, model: str, segment: str, keys: list[tuple[str, str]]) -> bool:
        """calmon.recal.guards.deferred: a model-level refit waits while the drift looks
        local."""
        return deferred(self.rc.per_segment, self.states, self._served, model, segment, keys)

    def _refit(self, now: float, model: str, segment: str, st: SeriesState, post: SampleSet,
               live: Live | None, trigger: str, keys: list[tuple[str, str]],
               samples_of: SamplesOf, cycle: float | None = None) -> Event:
        st.last_refit = now
        if cycle is None:  # changed again since: the newest regime only (calmon.recal.regime)
            post = newest(post, self.rc.method, self.cfg.metrics.bins, self.log_threshold(),
                          self._spacing(), self.rc.min_samples)
        prior = None
        if segment != ALL:
            model_live = self._served(model, ALL)
            form = platt_form(None if model_live is None else model_live.calibrator)
            if form is not None and post.score.ndim == 1:
                # SHRINK samples' worth of curvature: a sample adds p (1 - p) (the
                # prior's p), so a rare outcome's segment is not held back more
                z = to_logits(scores_as(post, input_kind(post)), input_kind(post))
                p0 = 1.0 / (1.0 + np.exp(-(form[0] * z + form[1])))
                prior = Prior(form[0], form[1], SHRINK * float(np.mean(p0 * (1.0 - p0))))
        guards: tuple[Guard, ...] = ()
        if segment == ALL and self.rc.per_segment:
            guards = segment_guards(self.rc, self._served, self.live, model, post,
                                    keys, samples_of, st.change_ts)
        # alpha spending over the retries of one alarm: attempt i gates at alpha / 2^i
        alpha = self.rc.alpha / 2 ** st.rejections
        result = refit(post, self.rc.method, None if live is None else live.calibrator,
                       self.rc.holdout_fraction, self.cfg.metrics.bins, alpha, prior, guards,
                       interleave=None if cycle is None else block(cycle))
        if result.outcome == "rejected":
            st.rejections += 1
            st.last_n, st.latch = len(post), Latch()  # the gate decided
        else:  # failed, or published (the state is replaced below): the cooldown applies
            st.rejections = 0
        fields: dict[str, Any] = {
            "method": result.method, "trigger": trigger,
            "fit_samples": result.fit_samples, "holdout_samples": result.holdout_samples,
            "holdout_before": None if result.before is None else result.before.as_dict(),
            "holdout_after": None if result.after is None else result.after.as_dict(),
        }
        held = None if cycle else self._held(model, segment, st, post, result, fields)
        if held is not None:
            return Event(now, model, segment, "held", held)
        if result.outcome != "published" or result.calibrator is None:
            fields["reason"] = result.reason
            log.info("refit of %r/%r %s: %s", model, segment, result.outcome, result.reason)
            return Event(now, model, segment, result.outcome, fields)
        doc = self.registry.publish(self._document(model, segment, now, trigger, st, result))
        assert result.after is not None
        self.published_ece[(model, segment)] = result.after.ece_debiased or 0.0
        self._restart(now, model, segment, post, samples_of)
        log.info("published %s calibrator v%d for %r/%r: %s", result.method, doc["version"],
                 model, segment, evidence(result))
        return Event(now, model, segment, "published", {**fields, "version": doc["version"]})

    def _held(self, model: str, segment: str, st: SeriesState, post: SampleSet,
              result: Refit, fields: dict[str, Any]) -> dict[str, Any] | None:
        """A refit ready to publish waits while the predictions made after its newest
        sample have moved from its reference (calmon.recal.hold); the next fit starts
        after that sample."""
        if result.outcome != "published" or self.scores_of is None or not len(post):
            return None
        newest = float(post.ts.max())
        shift = moved(self.scores_of(model, segment, newest), result.reference)
        if shift is None:
            return None
        st.regime_from = newest
        log.info("refit of %r/%r held: %d predictions since its data, PSI %.3f > %.3f",
                 model, segment, shift[1], shift[0], shift[2])
        return {**fields, "psi": shift[0], "threshold": shift[2], "newer_samples": shift[1]}

    def _restart(self, now: float, model: str, segment: str, post: SampleSet,
                 samples_of: SamplesOf) -> None:
        """The new calibrator is the new null: the detector restarts on predictions made
        after its ``fitted_at``."""
        fresh = samples_of(model, segment, 0)
        total = post.total if fresh is None else fresh.total
        self.states[(model, segment)] = SeriesState(
            Detector.new(float(math.ceil(now)), self._spacing()), self._basis(model, segment),
            total, total, last_refit=now)

    def _rollback(self, now: float, model: str, segment: str, st: SeriesState,
                  post: SampleSet, samples_of: SamplesOf) -> Event | None:
        """Undo a stale calibrator: the winner among the identity and earlier versions
        (calmon.recal.rollback.best_rollback), published as a new version (``method:
        identity`` for none)."""
        own = self._served(model, segment)
        if own is None or len(post) < MIN_ROLLBACK:
            return None
        # versions up to one a class reset set aside scored the old class count
        best = best_rollback(own, self.registry, model, segment, post, self.rc.alpha,
                             self._spacing(), self.log_threshold(),
                             skip_upto=self.set_aside.get((model, segment), -1))
        if best is None:
            return None
        doc, before, after = rollback_document(model, segment, iso(math.ceil(now)),
                                               st.change_ts, best, post, self.cfg.metrics.bins)
        gain, version = best[0], best[1]
        doc = self.registry.publish(doc)
        self.published_ece[(model, segment)] = after.ece_debiased or 0.0
        self._restart(now, model, segment, post, samples_of)
        log.info("rolled %r/%r back to %s as v%d (log-likelihood ratio %.1f over v%d)", model,
                 segment, "the identity" if version is None else f"v{version}",
                 doc["version"], gain, own.version)
        return Event(now, model, segment, "published", {
            "method": doc["method"], "trigger": "rollback", "rollback_of": version,
            "fit_samples": 0, "holdout_samples": len(post),
            "holdout_before": before.as_dict(), "holdout_after": after.as_dict(),
            "version": doc["version"]})

    def _document(self, model: str, segment: str, now: float, trigger: str, st: SeriesState,
                  r: Refit) -> dict[str, Any]:
        assert r.calibrator is not None
        return r.calibrator.to_json(
            # rounded up to the second, so no fit sample counts as predicted after it
            model=model, segment=segment, fitted_at=iso(math.ceil(now)), trigger=trigger,
            change_ts=st.change_ts, reference=r.reference,
            fit={"samples": r.fit_samples, "holdout_samples": r.holdout_samples,
                 "holdout_before": r.before.as_dict() if r.before else None,
                 "holdout_after": r.after.as_dict() if r.after else None})

    # ------------------------------------------------------------ readers

    def _classwise_on(self) -> bool:
        return (self.cfg.metrics.classwise
                and self.rc.triggers.classwise_ece_above is not None)

    def publish_readers(self) -> None:
        """What readers see (gauges, snapshot), as of the last check: replay, which
        publishes only when it reads them (``readers_each_check`` off)."""
        with self._lock:
            self._publish_readers()

    def _publish_readers(self) -> None:
        self.gauges = gauges_of(self.states, self.log_threshold(), self._classwise_on())
        self._snapshot = {
            "series": [[m, s, self._snap_of((m, s), st)]
                       for (m, s), st in sorted(self.states.items())],
            "published_ece": [[m, s, e] for (m, s), e in sorted(self.published_ece.items())],
            "set_aside": [[m, s, v] for (m, s), v in sorted(self.set_aside.items())],
        }
        if len(self._snaps) > len(self.states):  # forgotten series
            self._snaps = {k: v for k, v in self._snaps.items() if k in self.states}
        self._touched = set()

    def _snap_of(self, key: tuple[str, str], st: SeriesState) -> dict[str, Any]:
        """The series' snapshot; a series no check took past the idle test since the last
        publication (skip.idle) is unchanged, so its previous one stands (copying every
        detector every check was most of an idle check's cost)."""
        got = self._snaps.get(key)
        if got is None or got[0] is not st or key in self._touched:
            got = self._snaps[key] = (st, st.snapshot())
        return got[1]

    def forget(self, models: Iterable[str], *, reset: Iterable[str] = ()) -> None:
        """Drop every series state of ``models`` (their recalibration moved elsewhere, or
        the engine dropped them as idle) and of ``reset`` (a new class count), whose
        live calibrators are set aside too: they scored the old class count."""
        reset = set(reset)
        gone = set(models) | reset
        with self._lock:
            self.states = {k: v for k, v in self.states.items() if k[0] not in gone}
            self.published_ece = {k: v for k, v in self.published_ece.items()
                                  if k[0] not in gone}
            self.set_aside = {k: v for k, v in self.set_aside.items() if k[0] not in gone}
            self._logged = {k for k in self._logged if k[0] not in gone}
            for key in self.registry.series() if reset else ():
                live = self.registry.live(*key) if key[0] in reset else None
                if live is not None:
                    self.set_aside[key] = live.version
            self._untouched.reset()
            self._publish_readers()

    def snapshot(self) -> dict[str, Any]:
        """The state after the last check, as plain data (built by the checking thread,
        so a checkpoint never iterates what a check is writing)."""
        return self._snapshot

    def restore(self, snap: dict[str, Any]) -> None:
        with self._lock:
            self.states = {}
            for m, s, st in snap.get("series", []):
                try:
                    self.states[(str(m), str(s))] = SeriesState.restore(st)
                except (KeyError, TypeError, ValueError, IndexError):
                    continue  # a state of another version: that series starts afresh
            self.published_ece = {(m, s): float(e) for m, s, e in snap.get("published_ece", [])}
            self.set_aside = {(str(m), str(s)): int(v) for m, s, v in snap.get("set_aside", [])}
            self._untouched.reset()
            self._publish_readers()

    def calibrated(self, now: float | Callable[[str], float],
                   series: Iterable[tuple[str, str]],
                   samples_of: SamplesOf) -> list[tuple[str, str, str, float | None, int]]:
        """(model, segment, window, ECE, samples) after the live calibrator, on samples
        predicted after its ``fitted_at`` only (never the data it was fit on), in windows
        ending at ``now`` (or at each model's own ``now(model)``). Series without a
        calibrator are left to the caller (their raw window is exact)."""
        return readings(self.calibrated_windows(now, series, samples_of))[0]

    def calibrated_windows(self, now: float | Callable[[str], float],
                           series: Iterable[tuple[str, str]], samples_of: SamplesOf, *,
                           identity: bool = False) -> list[CalibratedWindow]:
        """Per series and window, the bins after the live calibrator
        (calmon.recal.calibrated.calibrated_windows)."""
        return calibrated_windows(self.cfg, self.live, now, series, samples_of,
                                  identity=identity, on_error=self._window_error)

    def _window_error(self, model: str, segment: str) -> None:
        """One series' calibrated windows raised: counted, logged once, skipped."""
        self.errors += 1
        if (model, segment) not in self._logged:
            self._logged.add((model, segment))
            log.exception("the calibrated windows of %r/%r raised; skipped (logged once, "
                          "counted in calmon_series_errors_total)", model, segment)

