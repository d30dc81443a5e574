"""Small segments among large ones (issue 34), per segment, the default policy unless
said; true ECEs on fresh samples of the regime in force.

- a tiny segment: 0.2% of 50,000 predictions a day (100 a day) among ten countries,
  true logit z ~ N(-2.5, 1); after a calibrated day its truth shifts by +2 logits
  (the model's scores do not move). Slices [[country]], 50 values (52 series in the
  alpha budget). Alarmed within 3 days, no event on any other series, every other
  country served true ECE <= 0.01; with min_samples 200 the tiny segment is served
  <= max(0.05, 2x) the true ECE of the oracle fit (the default method fitted on all its
  labelled post-change samples, the change time known);
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from calmon.engine.buffer import SampleSet
from calmon.recal.refit import fit_one
from tests.statistics.sim import DAY, T0, Simulation, binary, sim_config, true_ece

ALL = "__all__"
HOUR = 3600.0
CHANGE = T0 + DAY
TINY = 9  # the tiny country's index
TINY_SHARES = np.array([0.35, 0.2, 0.15, 0.1, 0.08, 0.05, 0.04, 0.02, 0.008, 0.002])


@dataclass(frozen=True)
class Tiny:
    events: list
    served: list[float]  # per country
    raw: list[float]
    oracle: float  # the tiny segment's oracle fit


@cache
def tiny(seed: int, min_samples: int = 2000) -> Tiny:
    sim = Simulation(sim_config(min_samples=min_samples, per_segment=True),
                     binary(mu=-2.5, sd=1.0, change_at=CHANGE, shift=2.0, shift_segment=TINY),
                     len(TINY_SHARES), 50_000, seed, shares=TINY_SHARES, record=True)
    run = sim.run(4.0)
    served, raw = [], []
    for seg in range(len(TINY_SHARES)):
        scores, truth = sim.fresh(sim.t, seg, 50_000)
        live = sim.policy.live("m", f"country=c{seg}")
        served.append(true_ece(None if live is None else live.calibrator, scores, truth))
        raw.append(true_ece(None, scores, truth))
    d = sim.drawn()
    mine = (d["seg"] == TINY) & (d["ts"] >= CHANGE) & (d["arrival"] < sim.t)
    post = SampleSet(d["ts"][mine], d["label"][mine], np.ones(int(mine.sum()), np.int8),
                     d["score"][mine])
    cal = fit_one("temperature", post.score, post.label, "logit", 15, None)
    scores, truth = sim.fresh(sim.t, TINY, 50_000)
    return Tiny(run.events, served, raw, true_ece(cal, scores, truth))


def test_a_tiny_segment_is_alarmed_alone() -> None:
    t = tiny(0)
    name = f"country=c{TINY}"
    print(f"\ntiny segment (100/day, +2 logits): {[(e.kind, e.segment) for e in t.events]}; "
          f"served {t.served[TINY]:.4f} (raw {t.raw[TINY]:.3f}); others' max "
          f"{max(v for i, v in enumerate(t.served) if i != TINY):.4f}")
    drift = [e for e in t.events if e.kind == "drift" and e.segment == name]
    assert drift and drift[0].ts - CHANGE <= 3 * DAY, t.events
    assert [e for e in t.events if e.segment != name] == []
    assert all(v <= 0.01 for i, v in enumerate(t.served) if i != TINY)


def test_a_tiny_segment_with_min_samples_200_is_fixed() -> None:
    t = tiny(0, 200)
    name = f"country=c{TINY}"
    print(f"\ntiny segment, min_samples 200: "
          f"{[(e.kind, round((e.ts - CHANGE) / HOUR, 1)) for e in t.events]}; served "
          f"{t.served[TINY]:.4f} (raw {t.raw[TINY]:.3f}, oracle fit {t.oracle:.4f})")
    assert [e for e in t.events if e.segment != name] == []
    assert t.served[TINY] <= max(0.05, 2 * t.oracle)
    assert all(v <= 0.01 for i, v in enumerate(t.served) if i != TINY)
