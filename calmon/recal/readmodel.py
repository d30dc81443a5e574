"""What the recalibration loop shows its readers (the exporter, the demo).

A plain, immutable-by-convention record, built whole by the scheduler thread
and handed out as is: the domain owns it, adapters such as the Prometheus
exporter only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecalState:
    """What the recalibration loop shows (filled by calmon.recal)."""

    calibrated_ece: list[tuple[str, str, str, float]] = field(default_factory=list)
    recalibrations: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    versions: dict[tuple[str, str], int] = field(default_factory=dict)
    temperatures: dict[tuple[str, str], float] = field(default_factory=dict)
    drift: dict[tuple[str, str, str], int] = field(default_factory=dict)
    calibrated_samples: list[tuple[str, str, str, int]] = field(default_factory=list)
    drift_evidence: dict[tuple[str, str], float] = field(default_factory=dict)
    drift_change_ts: dict[tuple[str, str], float] = field(default_factory=dict)
    alerts_failed: int = 0
    # checks skipped because the previous one was still running (APScheduler's
    # "maximum number of running instances reached"): a metric, not a log line
    overruns: int = 0
    # series whose calibrated windows raised (skipped, counted): calmon_series_errors_total
    series_errors: int = 0
    # (model, segment) series the loop evaluates and the methods a refit may report:
    # their recalibration counters are exported at 0 before the first refit, so
    # increase() sees the first one (no "series born" special case in alert rules)
    series: list[tuple[str, str]] = field(default_factory=list)
    methods: tuple[str, ...] = ()
    # scaled out (contract §7): models whose recalibration this instance owns; None
    # when one process recalibrates everything (no gauge then)
    owned_models: int | None = None
    # scaled out: refused records of the internal topics, by (topic name, reason), for
    # calmon_invalid_records_total
    invalid: dict[tuple[str, str], int] = field(default_factory=dict)
