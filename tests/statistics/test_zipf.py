"""The 1% segments of a 200-segment Zipf model (issue 34): served true ECE <= 0.03
three days after a drift, on every seed.

One segment key, 200 values whose traffic shares are Zipf (share 1 / rank): the top
values get most of the 40,000 predictions a day, ranks 14-21 get 0.8-1.25% each (~330-490
labelled samples a day: never min_samples 2,000 of their own within 3 days). True logit
z ~ N(-2, 1.5), labels 30 s to 5 min late, per segment, the default policy (5-minute
checks, alpha 0.01, min_samples 2,000) and max_values 200 (the alpha budget covers every
value). After a calibrated day the model turns 1.6x over-confident (reports 1.6 z) in
every segment. Three days later each 1% segment is served (its own calibrator, or the
model's when it has none) at true ECE <= 0.03, computed exactly (15 bins) from the
true probabilities of fresh samples of the regime in force.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from tests.statistics.sim import DAY, T0, Simulation, binary, sim_config, true_ece, uniform_delay

ALL = "__all__"
HOUR = 3600.0
CHANGE = T0 + DAY
VALUES = 200
PER_DAY = 40_000
ZIPF = 1.0 / np.arange(1, VALUES + 1)
ZIPF /= ZIPF.sum()
ONE_PERCENT = np.flatnonzero((ZIPF >= 0.008) & (ZIPF <= 0.0125))


@dataclass(frozen=True)
class Outcome:
    served: dict[int, float]  # per 1% segment (index)
    raw: float
    served_all: float
    events: list


@cache
def outcome(seed: int) -> Outcome:
    cfg = sim_config(min_samples=2000, per_segment=True, max_values=VALUES)
    sim = Simulation(cfg, binary(mu=-2.0, sd=1.5, change_at=CHANGE, scale=1.6), VALUES,
                     PER_DAY, seed, delay=uniform_delay(30.0, 300.0), shares=ZIPF)
    run = sim.run(1.0 + 3.0)
    served = {}
    for seg in ONE_PERCENT.tolist():
        scores, truth = sim.fresh(sim.t, seg, 100_000)
        live = sim.policy.live("m", f"country=c{seg}")
        served[seg] = true_ece(None if live is None else live.calibrator, scores, truth)
    scores, truth = sim.fresh(sim.t, 0, 100_000)
    live = sim.policy.live("m", ALL)
    return Outcome(served, true_ece(None, scores, truth),
                   true_ece(None if live is None else live.calibrator, scores, truth),
                   run.events)


def _report(seed: int, o: Outcome) -> str:
    pubs = [(e.segment, round((e.ts - CHANGE) / HOUR, 1)) for e in o.events
            if e.kind == "published"]
    drifts = sorted({e.segment for e in o.events if e.kind == "drift"})
    return (f"seed {seed}: 1% segments served "
            f"{', '.join(f'c{s} {v:.4f}' for s, v in o.served.items())} (raw {o.raw:.3f}); "
            f"__all__ served {o.served_all:.4f}; publishes (series, h after the change) "
            f"{pubs}; {len(drifts)} series alarmed")


def _check(seed: int) -> None:
    o = outcome(seed)
    print("\n" + _report(seed, o))
    assert len(ONE_PERCENT) >= 5
    assert max(o.served.values()) <= 0.03, o.served


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_the_one_percent_segments_are_served_calibrated_after_3_days(seed: int) -> None:
    _check(seed)
