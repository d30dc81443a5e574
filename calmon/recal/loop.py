"""The recalibration loop: an APScheduler job that watches, refits, publishes, alerts.

Each run (every ``recalibration.interval``) takes a view and sample copies from
the engine (its lock is held only while copying), then, per model (and per
segment with ``per_segment``):

1. computes the ECE of every window after the live calibrator
   (``calmon_calibrated_ece``; identity when none is live);
2. evaluates the triggers on the ``recalibration.window`` (``calmon_drift``);
3. when one fires outside the cooldown, refits on the buffered samples of that
   window and publishes only a calibrator that beats the live one on holdout.

Nothing here blocks the consumer loop: the job runs in the scheduler's thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine, Row, View
from calmon.engine.metrics import Bins, bins_from_samples, confidence_and_correct, ece
from calmon.engine.windows import BUCKETS
from calmon.io.exporter import RecalState
from calmon.recal.alerts import AlertSender
from calmon.recal.refit import Refit, apply_or_identity, input_kind, refit, scores_as
from calmon.recal.registry import Live, Publish, Registry
from calmon.recal.triggers import TRIGGERS, Decision, Reading, decide

log = logging.getLogger(__name__)

ALL = "__all__"
FIRST_RUN_S = 15.0


def in_window(ts: np.ndarray, seconds: float, now: float) -> np.ndarray:
    """Which samples the engine's window of ``seconds`` holds: the same buckets as the
    window's row (calmon.engine.windows), not simply ``ts > now - seconds``."""
    width = seconds / BUCKETS
    return np.floor(ts / width) > math.floor(now / width) - BUCKETS


class Recalibrator:
    def __init__(self, cfg: Config, engine: Engine, publish: Publish | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.rc = cfg.recalibration
        self.engine = engine
        self.registry = Registry(self.rc.output_dir, publish)
        self.alerts = AlertSender(cfg.alerts.webhook)
        self.clock = clock
        self._lock = threading.Lock()
        self._scheduler: Any = None
        # state kept across restarts (checkpointed with the engine)
        self.last_refit: dict[tuple[str, str], float] = {}  # wall time of the last attempt
        self.published_ece: dict[tuple[str, str], float] = {}  # holdout ECE at last publish
        # what the exporter shows (process-local)
        self._outcomes: Counter[tuple[str, str, str, str]] = Counter()
        self._calibrated: list[tuple[str, str, str, float]] = []
        self._drift: dict[tuple[str, str, str], int] = {}

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the background job (the daemon calls this; tests call ``run_once``)."""
        from apscheduler.schedulers.background import BackgroundScheduler

        self._scheduler = BackgroundScheduler(timezone=UTC)
        # the first run comes early (at most FIRST_RUN_S after start), so the drift and
        # calibrated-ECE gauges appear without waiting a whole interval
        first = datetime.now(UTC) + timedelta(seconds=min(self.rc.interval, FIRST_RUN_S))
        self._scheduler.add_job(self.run_once_safely, "interval", seconds=self.rc.interval,
                                id="recalibrate", max_instances=1, coalesce=True,
                                misfire_grace_time=None, next_run_time=first)
        self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    def run_once_safely(self) -> None:
        try:
            self.run_once()
        except Exception:  # a scheduler job must never die; the next run tries again
            log.exception("recalibration run failed")

    # ------------------------------------------------------------ one run

    def run_once(self) -> list[Refit]:
        view = self.engine.view()
        rows = {(r.model, r.segment, r.window): r for r in view.rows}
        results: list[Refit] = []
        calibrated: list[tuple[str, str, str, float]] = []
        drift: dict[tuple[str, str, str], int] = {}
        targets = [(m, s) for m, s, _ in self.engine.buffered_series()]
        for model, segment in targets:
            samples = self.engine.samples(model, segment)
            if samples is None or len(samples) == 0:
                continue
            live = self._live(model, segment)
            decision = self._decide(model, segment, samples, live, rows, view)
            if decision is not None:
                for trig in TRIGGERS:
                    was = self._drift.get((model, segment, trig), 0)
                    now_fires = int(trig in decision.fired)
                    drift[(model, segment, trig)] = now_fires
                    if now_fires and not was:
                        self._alert_drift(model, segment, trig, decision)
                if decision.fired and self._cooled(model, segment):
                    result = self._refit(model, segment, samples, live, decision, view)
                    results.append(result)
                    if result.outcome == "published":
                        live = self._live(model, segment)
            # after any refit, so the gauge shows the calibrator live from now on
            calibrated += self._calibrated_ece(model, segment, samples, live, rows, view)
        with self._lock:
            self._calibrated = calibrated
            self._drift = drift
        return results

    def _live(self, model: str, segment: str) -> Live | None:
        live = self.registry.live(model, segment)
        if live is None and segment != ALL:
            live = self.registry.live(model, ALL)  # per-segment falls back to the model's
        return live

    def _bins_after(self, live: Live | None, samples: SampleSet, seconds: float,
                    now: float) -> Bins | None:
        """Bins of the buffered samples inside a window, after the live calibrator."""
        mask = in_window(samples.ts, seconds, now)
        if not mask.any():
            return None
        kind = input_kind(samples)
        probs = apply_or_identity(None if live is None else live.calibrator,
                                  scores_as(samples, kind)[mask], kind)
        conf, correct = confidence_and_correct(probs, samples.label[mask])
        return bins_from_samples(conf, correct, self.cfg.metrics.bins)

    def calibrated_bins(self, model: str, segment: str, window: str) -> Bins | None:
        """The reliability diagram of a window after the live calibrator (for /reliability),
        from the buffered samples; None without a live calibrator or samples."""
        live = self._live(model, segment)
        samples = self.engine.samples(model, segment)
        if live is None or samples is None or len(samples) == 0:
            return None
        return self._bins_after(live, samples, self.cfg.window(window).seconds, self.engine.now)

    def _calibrated_ece(self, model: str, segment: str, samples: SampleSet, live: Live | None,
                        rows: dict[tuple[str, str, str], Row],
                        view: View) -> list[tuple[str, str, str, float]]:
        out = []
        for w in self.cfg.metrics.windows:
            row = rows.get((model, segment, w.name))
            if row is None or row.stats.samples == 0:
                continue
            if live is None:  # identity: exactly the raw window ECE
                out.append((model, segment, w.name, float(row.stats.ece or 0.0)))
                continue
            b = self._bins_after(live, samples, w.seconds, view.now)
            if b is not None:
                out.append((model, segment, w.name, ece(b.count, b.conf, b.correct)))
        return out

    def _decide(self, model: str, segment: str, samples: SampleSet, live: Live | None,
                rows: dict[tuple[str, str, str], Row], view: View) -> Decision | None:
        row = rows.get((model, segment, self.rc.window))
        if row is None:
            return None
        bins: Bins | None = row.stats.bins  # without a calibrator: the exact window counts
        if live is not None:  # what the model's scores look like after the live calibrator
            bins = self._bins_after(live, samples, self.cfg.window(self.rc.window).seconds,
                                    view.now)
            if bins is None:
                return None
        reading = Reading(bins, row.binary, self._baseline(model, segment, live))
        return decide(self.rc, reading)

    def _baseline(self, model: str, segment: str, live: Live | None) -> float | None:
        """The ECE ``ece_increase`` compares with: the live document's holdout ECE (so a
        rollback by the CLI moves it too), else the last publish this process made."""
        try:
            return float(live.doc["fit"]["holdout_after"]["ece"])  # type: ignore[union-attr]
        except (AttributeError, KeyError, TypeError, ValueError):
            return self.published_ece.get((model, segment))

    def _cooled(self, model: str, segment: str) -> bool:
        last = self.last_refit.get((model, segment))
        return last is None or self.clock() - last >= self.rc.cooldown

    def _refit(self, model: str, segment: str, samples: SampleSet, live: Live | None,
               decision: Decision, view: View) -> Refit:
        self.last_refit[(model, segment)] = self.clock()
        w = self.cfg.window(self.rc.window)
        mask = in_window(samples.ts, w.seconds, view.now)
        recent = SampleSet(samples.ts[mask], samples.label[mask], samples.kind[mask],
                           samples.score[mask])
        trigger = decision.fired[0]
        try:
            result = refit(recent, self.rc.method, None if live is None else live.calibrator,
                           self.rc.holdout_fraction, self.cfg.metrics.bins)
        except Exception as e:  # numerical trouble is an outcome, not a crash
            log.exception("refit of %s/%s failed", model, segment)
            result = Refit("failed", self.rc.method, None, 0, 0, None, None, str(e))
        doc = None
        if result.outcome == "published" and result.calibrator is not None:
            doc = self.registry.publish(result.calibrator.to_json(
                model=model, segment=segment,
                fitted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                trigger=trigger,
                fit={"samples": result.fit_samples, "holdout_samples": result.holdout_samples,
                     "holdout_before": result.before.as_dict() if result.before else None,
                     "holdout_after": result.after.as_dict() if result.after else None}))
            assert result.after is not None
            self.published_ece[(model, segment)] = result.after.ece
            log.info("published %s calibrator v%d for %s/%s (holdout ECE %.4f -> %.4f)",
                     result.method, doc["version"], model, segment,
                     result.before.ece if result.before else math.nan, result.after.ece)
        else:
            log.info("refit of %s/%s %s: %s", model, segment, result.outcome, result.reason)
        with self._lock:
            self._outcomes[(model, segment, result.method, result.outcome)] += 1
        self._alert_refit(model, segment, trigger, result, doc, decision)
        return result

    # ------------------------------------------------------------ alerts

    def _alert_refit(self, model: str, segment: str, trigger: str, r: Refit,
                     doc: dict[str, Any] | None, d: Decision) -> None:
        name = {"published": "CalmonRecalibrationPublished",
                "rejected": "CalmonRecalibrationRejected",
                "failed": "CalmonRecalibrationFailed"}[r.outcome]
        ann: dict[str, Any] = {
            "summary": f"{r.method} refit for {model}/{segment}: {r.outcome}",
            "trigger": trigger, "ece": f"{d.ece:.6f}", "null_quantile": f"{d.null_quantile:.6f}",
            "fit_samples": r.fit_samples, "holdout_samples": r.holdout_samples,
        }
        if r.before is not None:
            ann.update(holdout_ece_before=r.before.ece, holdout_nll_before=r.before.nll)
        if r.after is not None:
            ann.update(holdout_ece_after=r.after.ece, holdout_nll_after=r.after.nll)
        if doc is not None:
            ann["version"] = doc["version"]
        if r.reason:
            ann["reason"] = r.reason
        severity = "warning" if r.outcome == "failed" else "info"
        self.alerts.send(name, {"model": model, "segment": segment, "method": r.method},
                         ann, severity)

    def _alert_drift(self, model: str, segment: str, trigger: str, d: Decision) -> None:
        self.alerts.send("CalmonCalibrationDrift",
                         {"model": model, "segment": segment, "trigger": trigger},
                         {"summary": f"calibration drift on {model}/{segment} ({trigger})",
                          "ece": f"{d.ece:.6f}", "null_quantile": f"{d.null_quantile:.6f}",
                          "observed_over_expected": d.observed_over_expected},
                         "warning")

    # ------------------------------------------------------------ readers, state

    def metrics_state(self) -> RecalState:
        versions: dict[tuple[str, str], int] = {}
        temps: dict[tuple[str, str], float] = {}
        for e in self.registry.entries():
            if e["live"] is None:
                continue
            versions[(e["model"], e["segment"])] = e["live"]
            live = self.registry.live(e["model"], e["segment"])
            if live is not None and live.doc.get("method") == "temperature":
                temps[(e["model"], e["segment"])] = float(live.doc["params"]["temperature"])
        with self._lock:
            return RecalState(list(self._calibrated), dict(self._outcomes), versions, temps,
                              dict(self._drift))

    def snapshot(self) -> dict[str, Any]:
        return {"last_refit": [[m, s, t] for (m, s), t in self.last_refit.items()],
                "published_ece": [[m, s, e] for (m, s), e in self.published_ece.items()]}

    def restore(self, snap: dict[str, Any]) -> None:
        self.last_refit = {(m, s): float(t) for m, s, t in snap.get("last_refit", [])}
        self.published_ece = {(m, s): float(e) for m, s, e in snap.get("published_ece", [])}
