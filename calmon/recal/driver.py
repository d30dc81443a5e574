"""One recalibration driver: the ``Policy`` run over a set of series, and what follows
its decisions, for the in-process loop (``recal/loop.py``, one instance) and the
scaled-out owner (``cluster/service.py``) alike.

A ``run`` reads each series' ring once (``read_once``: the check and the calibrated
windows share that read), checks the policy on each model's own clock, hands the
live calibrators to whoever serves estimates, computes the calibrated readings once
(so readers only read), counts the outcomes and sends the refit reports that no
metric carries. What readers get is replaced whole under a lock.

The one difference between its users is where a series without a calibrator reads
its calibrated (= raw) ECE: the in-process loop has the exact window (``raw_rows``,
its snapshot's rows); the owner has only every instance's buffered samples
(``identity``: the buffer scored as given).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from calmon.config import Config
from calmon.engine.metrics import Bins
from calmon.engine.rows import Row
from calmon.names import FIT_METHODS
from calmon.recal.alerts import AlertSender
from calmon.recal.calibrated import CalibratedRow, SamplesOf, read_once, readings
from calmon.recal.live import LiveCalibrators
from calmon.recal.policy import Event, Policy
from calmon.recal.readmodel import RecalState
from calmon.recal.registry import Registry

log = logging.getLogger(__name__)

EVENTS_KEPT = 1000  # the newest events a driver keeps for readers
Outcome = tuple[str, str, str, str]  # (model, segment, method, outcome)


def fit_methods(method: str) -> tuple[str, ...]:
    """The methods a refit may report under ``recalibration.method``: their counters
    are exported at 0 from the start, so increase() sees the first refit."""
    return FIT_METHODS if method == "auto" else (method,)


class Driver:
    def __init__(self, cfg: Config, policy: Policy, live: LiveCalibrators,
                 alerts: AlertSender, *,
                 raw_rows: Callable[[], Sequence[Row]] | None = None,
                 alarms_to_engine: bool = True) -> None:
        """``raw_rows``: the exact window rows of series without a calibrator (the
        in-process loop); None: those are read from the buffer as given (the owner).
        ``alarms_to_engine``: the engine's estimation maps fit the regimes the alarms
        say (off scaled out: only the owner sees an alarm, and every instance's maps
        follow the same live calibrators)."""
        self.cfg = cfg
        self.policy = policy
        self.registry: Registry = policy.registry
        self.live = live
        self.alerts = alerts
        self.raw_rows = raw_rows
        self.alarms_to_engine = alarms_to_engine
        self.methods = fit_methods(cfg.recalibration.method)
        self.lock = threading.Lock()
        # what readers get, replaced whole under the lock by each run
        self.outcomes: Counter[Outcome] = Counter()
        self.calibrated: list[CalibratedRow] = []
        self.calibrated_bins: dict[tuple[str, str, str], Bins] = {}
        self.series: list[tuple[str, str]] = []  # the series the last run checked
        self.events: list[Event] = []  # newest last (bounded)
        self.checks = 0  # runs completed (/status: a check began after n was read once n + 2)

    # ------------------------------------------------------------ one run

    def run(self, now_of: Callable[[str], float], series: Sequence[tuple[str, str]],
            samples_of: SamplesOf) -> list[Event]:
        """One check of ``series``, each model on ``now_of(model)``, and what follows."""
        samples_of = read_once(samples_of)
        events = self.policy.check_each(now_of, series, samples_of)
        # a CLI rollback or a publish shows from this run on; the estimation maps fit
        # the regimes the alarms say
        self.live.refresh(self.policy.gauges.change_ts if self.alarms_to_engine else None)
        calibrated, bins = readings(self.policy.calibrated_windows(
            now_of, series, samples_of, identity=self.raw_rows is None))
        if self.raw_rows is not None:
            calibrated += self._raw(series, calibrated)
        with self.lock:
            outcomes = Counter(self.outcomes)
            for e in events:
                if e.kind != "drift":
                    outcomes[(e.model, e.segment, str(e.fields.get("method")), e.kind)] += 1
            self.outcomes = outcomes
            self.calibrated = calibrated
            self.calibrated_bins = bins
            self.series = list(series)
            self.events = (self.events + events)[-EVENTS_KEPT:]
            self.checks += 1
        for e in events:
            log.info("recalibration %s of %s/%s: %s", e.kind, e.model, e.segment,
                     {k: v for k, v in e.fields.items() if k in ("version", "reason")})
            self._alert(e)
        return events

    def _raw(self, series: Sequence[tuple[str, str]],
             done: list[CalibratedRow]) -> list[CalibratedRow]:
        """Series without a calibrator: the identity, i.e. exactly the raw window (a
        series skipped because it raised has a calibrator: it shows nothing)."""
        assert self.raw_rows is not None
        have = {(m, s) for m, s, _, _, _ in done}
        todo = {k for k in set(series) - have if self.policy.live(*k) is None}
        return [(row.model, row.segment, row.window, row.stats.ece, int(row.stats.samples))
                for row in self.raw_rows()
                if (row.model, row.segment) in todo and row.stats.samples]

    def forget(self, models: Iterable[str]) -> None:
        """The outcome counters of ``models`` go (their policy state is the policy's)."""
        gone = set(models)
        with self.lock:
            self.outcomes = Counter({k: v for k, v in self.outcomes.items()
                                     if k[0] not in gone})

    # ------------------------------------------------------------ alerts

    def _alert(self, e: Event) -> None:
        """Only what metrics cannot say: a refit's outcome with its parameters. Drift and
        failures are alerted by Prometheus rules on calmon_drift and the counters."""
        if e.kind not in ("published", "rejected"):
            return
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
        name = "CalmonRefitPublished" if e.kind == "published" else "CalmonRefitRejected"
        self.alerts.send(name, {"model": e.model, "segment": e.segment,
                                "method": str(f.get("method"))}, ann, "info")

    # ------------------------------------------------------------ readers

    def held(self) -> int:
        """Refits held (v4) since start."""
        with self.lock:
            return sum(n for k, n in self.outcomes.items() if k[3] == "held")

    def state(self, series: Sequence[tuple[str, str]],
              owned: Callable[[str], bool] = lambda _model: True) -> RecalState:
        """What the exporter shows of the series ``series`` (their counters at 0 from
        the start) and of the models ``owned`` says are this driver's."""
        live = self.live.latest()
        g = self.policy.gauges  # immutable, replaced whole by each check
        with self.lock:
            calibrated = [c for c in self.calibrated if owned(c[0])]
            outcomes = dict(self.outcomes)
        return RecalState(
            [(m, s, w, v) for m, s, w, v, _ in calibrated if v is not None], outcomes,
            {k: v for k, v in live.versions.items() if owned(k[0])},
            {k: v for k, v in live.temperatures.items() if owned(k[0])},
            {k: v for k, v in g.drift.items() if owned(k[0])},
            calibrated_samples=[(m, s, w, n) for m, s, w, _, n in calibrated],
            drift_evidence={k: v for k, v in g.evidence.items() if owned(k[0])},
            drift_change_ts={k: v for k, v in g.change_ts.items() if owned(k[0])},
            alerts_failed=self.alerts.failed, series=list(series), methods=self.methods,
            series_errors=self.policy.errors)
