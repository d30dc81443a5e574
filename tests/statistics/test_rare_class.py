"""A rare class, coded 1 or coded 0 (issue 34): the policy is symmetric in the classes.

A fraud model: true logit z ~ N(-7.4, 1) (0.1% positives), 100,000 predictions a day,
prompt labels; after a calibrated day the odds of a positive double (the truth becomes
z + log 2, the model's scores do not move). The mirror is the same stream with labels
flipped and scores negated (99.9% positives: its rare class is coded 0). Default policy.
Both must be alarmed within 8x the SPRT oracle's post-change samples (the known
alternative's likelihood ratio on the same samples until 1/alpha), published within
24 h, and served a rare-class mean probability within 0.85-1.15 of the true one
(E[q] / E[p] on fresh samples, q served, p true), with no alarm before the change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from scipy.special import expit

from tests.statistics.sim import (
    DAY,
    T0,
    Simulation,
    post_change,
    probs_of,
    sim_config,
    sprt_samples,
)

ALL = "__all__"
HOUR = 3600.0
CHANGE = T0 + DAY
MU = -7.4


def fraud(mirror: bool):
    def draw(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(MU, 1.0, n)
        truth = expit(z + (math.log(2.0) if t >= CHANGE else 0.0))
        return (-z, 1.0 - truth) if mirror else (z, truth)

    return draw


@dataclass(frozen=True)
class Outcome:
    events: list
    samples: int | None
    sprt: int | None
    ratio: float  # served E[q] / E[p] of the rare class
    raw_ratio: float


@cache
def outcome(mirror: bool, seed: int) -> Outcome:
    sim = Simulation(sim_config(min_samples=2000), fraud(mirror), 1, 100_000, seed,
                     shares=np.ones(1), record=True)
    run = sim.run(2.0)
    drift = next((e for e in run.events if e.kind == "drift"), None)
    d = sim.drawn()
    every = post_change(d, CHANGE, np.inf)
    sprt = sprt_samples(probs_of(every["score"]), every["truth"], every["label"])
    read = None if drift is None else len(post_change(d, CHANGE, drift.ts)["ts"])
    scores, truth = sim.fresh(CHANGE + DAY, 0, 2_000_000)
    live = sim.policy.live("m", ALL)
    served = expit(scores) if live is None else live.calibrator.apply(scores)
    if mirror:  # the rare class is 0
        served, truth, raw = 1.0 - served, 1.0 - truth, 1.0 - expit(scores)
    else:
        raw = expit(scores)
    return Outcome(run.events, read, sprt, float(served.mean() / truth.mean()),
                   float(raw.mean() / truth.mean()))


def _line(mirror: bool, seed: int, o: Outcome) -> str:
    ev = " ".join(f"{e.kind}@{(e.ts - CHANGE) / HOUR:+.1f}h({e.fields.get('trigger')})"
                  for e in o.events)
    return (f"{'mirror (99.9% positive)' if mirror else '0.1% positive'}, seed {seed}: "
            f"{ev}; alarm after {o.samples} post-change samples (SPRT {o.sprt}); rare class "
            f"E[q]/E[p] served {o.ratio:.3f} (raw {o.raw_ratio:.3f})")


@pytest.mark.parametrize("mirror", [False, True], ids=["rare-positive", "rare-negative"])
def test_a_rare_class_is_fixed_whichever_way_it_is_coded(mirror: bool) -> None:
    o = outcome(mirror, 0)
    print("\n" + _line(mirror, 0, o))
    assert [e for e in o.events if e.ts < CHANGE] == []
    assert o.samples is not None and o.sprt is not None, o.events
    assert o.samples <= 8 * o.sprt
    pubs = [e for e in o.events if e.kind == "published"]
    assert pubs and pubs[0].ts - CHANGE <= 24 * HOUR, o.events
    assert 0.85 <= o.ratio <= 1.15
