"""The recalibration loop: an APScheduler job that drives the policy on live data.

Each run (every ``recalibration.interval``) hands the policy (calmon.recal.policy)
the engine's event time and a way to copy a series' buffered samples (the engine's
lock is held only while copying), and turns the events into counters, gauges and
webhook alerts. ``calmon replay --recalibrate`` drives the same policy over files.

Threads: the scheduler's thread is the only one that runs checks and writes the
policy's state; readers (exporter, checkpoint, demo) get immutable objects that
each check publishes whole. Alerts leave this thread through a bounded queue.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from calmon.calibrators import METHODS
from calmon.calibrators.signing import Signer
from calmon.config import Config
from calmon.engine.engine import Engine, Row
from calmon.engine.forgotten import RESET
from calmon.engine.metrics import Bins
from calmon.engine.series import ALL
from calmon.engine.snapshot import Refresher
from calmon.engine.windows import in_window
from calmon.recal.alerts import AlertSender
from calmon.recal.live import LiveCalibrators
from calmon.recal.newer import newer_scores
from calmon.recal.policy import (
    Event,
    Policy,
    readings,
)
from calmon.recal.readmodel import RecalState
from calmon.recal.registry import Publish, Registry

log = logging.getLogger(__name__)

FIRST_RUN_S = 15.0
__all__ = ["ALL", "FIRST_RUN_S", "Recalibrator", "in_window"]


class Recalibrator:
    def __init__(self, cfg: Config, engine: Engine, publish: Publish | None = None, *,
                 rows: Callable[[], Sequence[Row]] | None = None) -> None:
        """``rows``: the window rows a run reads the raw ECE of (the daemon passes its
        latest snapshot's, computed off this thread); default: this loop's own
        ``Refresher``, brought up to date by each run (the same read model)."""
        self.cfg = cfg
        if rows is None:
            refresher = Refresher(engine)
            rows = lambda: refresher.update(full=True).rows  # noqa: E731
        self.rows = rows
        self.rc = cfg.recalibration
        self.engine = engine
        self.registry = Registry(self.rc.output_dir, publish,
                                 signer=Signer.from_config(cfg.calibrators),
                                 verify_keys=cfg.calibrators.verify_keys)
        self.policy = Policy(cfg, self.registry)
        self.policy.scores_of = partial(newer_scores, engine)  # holds (v4)
        self.alerts = AlertSender(cfg.alerts.webhook)
        self._lock = threading.Lock()
        self._scheduler: Any = None
        # what the exporter shows (process-local), replaced whole under the lock
        self._outcomes: Counter[tuple[str, str, str, str]] = Counter()
        self._calibrated: list[tuple[str, str, str, float | None, int]] = []
        self._calibrated_bins: dict[tuple[str, str, str], Bins] = {}
        # output_dir's live calibrators, read by the runs (never by scrapes)
        self.live = LiveCalibrators(self.registry, engine, aside=self.policy.is_aside)
        self._series: list[tuple[str, str]] = []  # the series the last run evaluated
        self.events: list[Event] = []  # this process's events, newest last (bounded)
        self.overruns = 0  # checks skipped while the previous one still ran
        self.checks = 0  # checks completed (/status: a check began after n was read once n + 2)
        self._forgotten = engine.class_counts.forgotten.cursor()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the background job (the daemon calls this; tests call ``run_once``)."""
        from apscheduler.schedulers.background import BackgroundScheduler

        self.alerts.start()
        self.live.refresh()  # what is on disk already serves the estimates
        self._scheduler = BackgroundScheduler(timezone=UTC)
        # the first run comes early (at most FIRST_RUN_S after start), so the drift and
        # calibrated-ECE gauges appear without waiting a whole interval
        first = datetime.now(UTC) + timedelta(seconds=min(self.rc.interval, FIRST_RUN_S))
        self._scheduler.add_job(self.run_once_safely, "interval", seconds=self.rc.interval,
                                id="recalibrate", max_instances=1, coalesce=True,
                                misfire_grace_time=None, next_run_time=first)
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES

        self._scheduler.add_listener(self._overrun, EVENT_JOB_MAX_INSTANCES)
        self._scheduler.start()

    def _overrun(self, _event: object) -> None:
        """A check came due while the previous one still ran: counted, not logged."""
        with self._lock:
            self.overruns += 1

    def __enter__(self) -> Recalibrator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        self.alerts.stop()

    def run_once_safely(self) -> None:
        try:
            self.run_once()
        except Exception:  # a scheduler job must never die; the next run tries again
            log.exception("recalibration run failed")

    # ------------------------------------------------------------ one run

    def run_once(self) -> list[Event]:
        if not math.isfinite(self.engine.now):
            return []
        self._forget()
        series = [(m, s) for m, s, _ in self.engine.buffered_series()]
        # each model on its own event time (contract §2)
        events = self.policy.check_each(self.engine.now_of, series, self.engine.samples)
        # a CLI rollback shows from this run on; the estimation maps fit the regimes
        self.live.refresh(self.policy.gauges.change_ts)
        # once a run, so /reliability and the exporter only read (contract §5)
        windows = self.policy.calibrated_windows(self.engine.now_of, series,
                                                 self.engine.samples)
        calibrated, bins = readings(windows)
        # series without a calibrator: the identity, i.e. exactly the raw window
        done = {(m, s) for m, s, _, _, _ in calibrated}
        # (a series skipped because it raised has a calibrator: it shows nothing)
        todo = {k for k in set(series) - done if self.policy.live(*k) is None}
        for row in self.rows():
            if (row.model, row.segment) in todo and row.stats.samples:
                calibrated.append((row.model, row.segment, row.window, row.stats.ece,
                                   int(row.stats.samples)))
        with self._lock:
            outcomes = Counter(self._outcomes)
            for e in events:
                if e.kind != "drift":
                    outcomes[(e.model, e.segment, str(e.fields.get("method")), e.kind)] += 1
            self._outcomes = outcomes
            self._calibrated = calibrated
            self._calibrated_bins = bins
            self._series = series
            self.events = (self.events + events)[-1000:]
            self.checks += 1
        for e in events:
            self._alert(e)
        return events

    def _forget(self) -> None:
        """Models the engine dropped (idle) or reset (a new class count) since the last
        run are forgotten here too, at once: detector states, published ECEs, outcome
        counters, and the live calibrators of a reset model's old class count."""
        gone = self._forgotten.take()
        if gone is None:  # first run, or the engine was restored: keep what it holds
            with self.engine.lock:
                held = {m for m in self.engine.models if m}
            with self._lock:
                known = {k[0] for k in self._outcomes}
            kept = [*self.policy.states, *self.policy.published_ece]
            dropped = ({m for m, _ in kept} | known) - held
            reset: set[str] = set()
        else:
            reset = {m for m, why in gone if why == RESET}
            dropped = {m for m, why in gone if why != RESET}
        if not dropped and not reset:
            return
        self.policy.forget(dropped, reset=reset)
        self.live.refresh()  # a set-aside calibrator no longer serves the estimates
        models = dropped | reset
        with self._lock:
            self._outcomes = Counter({k: v for k, v in self._outcomes.items()
                                      if k[0] not in models})
        log.info("recalibration forgot %d dropped and %d reset model(s)", len(dropped),
                 len(reset))

    def _methods(self) -> tuple[str, ...]:
        """Methods a refit may report: their counters are exported at 0 from the start
        (the exporter pre-creates them), so increase() sees the first refit."""
        return (*METHODS, "auto") if self.rc.method == "auto" else (self.rc.method,)

    def calibrated_bins(self, model: str, segment: str, window: str) -> Bins | None:
        """The reliability diagram of a window after the live calibrator (for /reliability),
        from buffered samples predicted after its fit, as of the last run; None without
        a calibrator."""
        return self._calibrated_bins.get((model, segment, window))

    # ------------------------------------------------------------ alerts

    def _alert(self, e: Event) -> None:
        """Only what metrics cannot say: a refit's outcome with its parameters. Drift and
        failures are alerted by Prometheus rules on calmon_drift and the counters."""
        if e.kind not in ("published", "rejected"):
            return
        name = {"published": "CalmonRefitPublished",
                "rejected": "CalmonRefitRejected"}[e.kind]
        f = e.fields
        ann: dict[str, Any] = {
            "summary": f"{f.get('method')} refit for {e.model}/{e.segment}: {e.kind}",
            "trigger": f.get("trigger"), "fit_samples": f.get("fit_samples"),
            "holdout_samples": f.get("holdout_samples"),
        }
        for side in ("before", "after"):
            ev = f.get(f"holdout_{side}")
            if ev:
                ann[f"holdout_ece_{side}"] = ev["ece"]
                ann[f"holdout_nll_{side}"] = ev["nll"]
        if "version" in f:
            ann["version"] = f["version"]
            live = self.registry.live(e.model, e.segment)
            if live is not None:
                ann["params"] = live.doc.get("params")
        if f.get("reason"):
            ann["reason"] = f["reason"]
        self.alerts.send(name, {"model": e.model, "segment": e.segment,
                                "method": str(f.get("method"))}, ann, "info")

    # ------------------------------------------------------------ readers, state

    def status(self) -> dict[str, int]:
        """/status: the checks completed and (v4) the refits held since start."""
        with self._lock:
            held = sum(n for k, n in self._outcomes.items() if k[3] == "held")
        return {"checks": self.checks, "held": held}

    def metrics_state(self) -> RecalState:
        live = self.live.latest()
        versions, temps = live.versions, live.temperatures
        g = self.policy.gauges  # immutable, replaced whole by each check
        with self._lock:
            calibrated = list(self._calibrated)
            outcomes = dict(self._outcomes)
            series = list(self._series)
        return RecalState(
            [(m, s, w, v) for m, s, w, v, _ in calibrated if v is not None], outcomes,
            versions, temps, dict(g.drift),
            calibrated_samples=[(m, s, w, n) for m, s, w, _, n in calibrated],
            drift_evidence=dict(g.evidence), drift_change_ts=dict(g.change_ts),
            alerts_failed=self.alerts.failed, series=series, methods=self._methods(),
            overruns=self.overruns, series_errors=self.policy.errors)

    def calibrated_rows(self) -> list[tuple[str, str, str, float | None, int]]:
        with self._lock:
            return list(self._calibrated)

    def snapshot(self) -> dict[str, Any]:
        return {"policy": self.policy.snapshot()}

    def restore(self, snap: dict[str, Any]) -> None:
        if isinstance(snap.get("policy"), dict):
            self.policy.restore(snap["policy"])

