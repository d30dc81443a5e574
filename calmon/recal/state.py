"""What the policy keeps per series between checks (``SeriesState``, checkpointed),
what a check decides (``Event``: a line of the event stream) and what it shows readers
(``Gauges``, published whole after each check)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from calmon.engine.buffer import SampleSet
from calmon.recal.detect import Detector
from calmon.recal.latch import Latch
from calmon.recal.triggers import TRIGGERS


@dataclass
class SeriesState:
    detector: Detector
    basis: tuple[int | None, int | None]  # live versions (own, model's) the null is about
    seen: int = 0  # ring total already fed
    reset_total: int = 0  # ring total when the detector restarted
    drifting: tuple[str, ...] = ()
    change_ts: float | None = None
    last_refit: float | None = None
    rejections: int = 0  # rejected refits since the detector restarted
    last_n: int = 0  # post-change samples the last rejected refit had
    announced: bool = False  # this alarm's drift event was emitted
    latch: Latch = field(default_factory=Latch)  # until the gate decides (v4)
    regime_from: float | None = None  # after a held refit: fit only samples predicted later
    # read from the ring but predicted too recently to have all their labels (not
    # checkpointed: dropping them depends on their prediction time only)
    held: SampleSet | None = None

    def snapshot(self) -> dict[str, Any]:
        return {"detector": self.detector.snapshot(), "basis": list(self.basis),
                "seen": self.seen, "reset_total": self.reset_total,
                "drifting": list(self.drifting), "change_ts": self.change_ts,
                "last_refit": self.last_refit, "rejections": self.rejections,
                "last_n": self.last_n, "announced": self.announced,
                "latch": self.latch.as_list(), "regime_from": self.regime_from}

    @classmethod
    def restore(cls, s: dict[str, Any]) -> SeriesState:
        b = s["basis"]
        return cls(Detector.restore(s["detector"]), (b[0], b[1]), int(s["seen"]),
                   int(s["reset_total"]), tuple(s["drifting"]), s["change_ts"],
                   s["last_refit"], int(s.get("rejections", 0)), int(s.get("last_n", 0)),
                   bool(s.get("announced", False)), latch=Latch.of(s.get("latch")),
                   regime_from=s.get("regime_from"))


@dataclass(frozen=True)
class Event:
    ts: float
    model: str
    segment: str
    kind: str  # drift | published | rejected | failed | held
    fields: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "model": self.model, "segment": self.segment,
                "kind": self.kind, **self.fields}


@dataclass(frozen=True)
class Gauges:
    """What the exporter shows, published whole after each check (readers never see a
    dict being written)."""

    evidence: dict[tuple[str, str], float] = field(default_factory=dict)
    change_ts: dict[tuple[str, str], float] = field(default_factory=dict)
    drift: dict[tuple[str, str, str], int] = field(default_factory=dict)


def gauges_of(states: dict[tuple[str, str], SeriesState], log_threshold: float,
              classwise: bool) -> Gauges:
    """What the readers show of the series' states: each detector's evidence against
    its threshold, the change times of the alarmed, and which triggers fire."""
    evidence, change, drift = {}, {}, {}
    for key, st in states.items():
        d = st.detector
        lm = max(d.log_m, log_threshold) if d.alarmed else d.log_m
        evidence[key] = math.exp(min(lm - log_threshold, 690.0))
        if d.alarmed and st.change_ts is not None:
            change[key] = st.change_ts
        for trig in (*TRIGGERS, "evidence"):
            if trig in st.drifting or trig not in ("evidence", "classwise_ece_above") or (
                    trig == "classwise_ece_above" and classwise):
                drift[(*key, trig)] = int(trig in st.drifting)
    return Gauges(evidence, change, drift)
