"""The recalibration loop: an APScheduler job that drives the policy on live data.

Each run (every ``recalibration.interval``) hands the driver (calmon.recal.driver,
the scaled-out owner's too) the engine's event time and a way to copy a series'
buffered samples (the engine's lock is held only while copying); it runs the policy
and turns the events into counters, gauges and webhook alerts. The loop adds what is
the engine's: its schedule, and the models the engine forgot. ``calmon replay
--recalibrate`` drives the same policy over files.

Threads: the scheduler's thread is the only one that runs checks and writes the
policy's state; readers (exporter, checkpoint, demo) get immutable objects that
each check publishes whole. Alerts leave this thread through a bounded queue.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from calmon.calibrators.signing import Signer
from calmon.config import Config
from calmon.engine.engine import Engine, Row
from calmon.engine.forgotten import RESET
from calmon.engine.metrics import Bins
from calmon.engine.series import ALL
from calmon.engine.snapshot import Refresher
from calmon.engine.windows import in_window
from calmon.recal.alerts import AlertSender
from calmon.recal.driver import Driver
from calmon.recal.live import LiveCalibrators
from calmon.recal.newer import newer_scores
from calmon.recal.policy import Event, Policy
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
        # output_dir's live calibrators, read by the runs (never by scrapes)
        self.live = LiveCalibrators(self.registry, engine, aside=self.policy.is_aside)
        # the policy run and what follows it; the series without a calibrator read
        # their exact raw window from the snapshot's rows
        self.driver = Driver(cfg, self.policy, self.live, self.alerts, raw_rows=rows)
        self.overruns = 0  # checks skipped while the previous one still ran
        self._forgotten = engine.class_counts.forgotten.cursor()

    @property
    def events(self) -> list[Event]:
        """This process's events, newest last (bounded), replaced whole by each run."""
        return self.driver.events

    @property
    def checks(self) -> int:
        """Checks completed (/status: a check began after n was read once n + 2)."""
        return self.driver.checks

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
        return self.driver.run(self.engine.now_of, series, self.engine.samples)

    def _forget(self) -> None:
        """Models the engine dropped (idle) or reset (a new class count) since the last
        run are forgotten here too, at once: detector states, published ECEs, outcome
        counters, and the live calibrators of a reset model's old class count."""
        gone = self._forgotten.take()
        if gone is None:  # first run, or the engine was restored: keep what it holds
            with self.engine.lock:
                held = {m for m in self.engine.models if m}
            with self.driver.lock:
                known = {k[0] for k in self.driver.outcomes}
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
        self.driver.forget(dropped | reset)
        log.info("recalibration forgot %d dropped and %d reset model(s)", len(dropped),
                 len(reset))

    def calibrated_bins(self, model: str, segment: str, window: str) -> Bins | None:
        """The reliability diagram of a window after the live calibrator (for /reliability),
        from buffered samples predicted after its fit, as of the last run; None without
        a calibrator."""
        return self.driver.calibrated_bins.get((model, segment, window))

    # ------------------------------------------------------------ readers, state

    def status(self) -> dict[str, int]:
        """/status: the checks completed and (v4) the refits held since start."""
        return {"checks": self.driver.checks, "held": self.driver.held()}

    def metrics_state(self) -> RecalState:
        """What the exporter shows: every buffered series' counters from the start."""
        st = self.driver.state([(m, s) for m, s, _ in self.engine.buffered_series()])
        st.overruns = self.overruns
        return st

    def calibrated_rows(self) -> list[tuple[str, str, str, float | None, int]]:
        with self.driver.lock:
            return list(self.driver.calibrated)

    def snapshot(self) -> dict[str, Any]:
        return {"policy": self.policy.snapshot()}

    def restore(self, snap: dict[str, Any]) -> None:
        if isinstance(snap.get("policy"), dict):
            self.policy.restore(snap["policy"])

