"""Refits that come when they are due (issue 23): samples counted since the change,
event time under label delay, small series. Each scenario runs the daemon's policy
(calmon.recal.policy.Policy) on simulated event time (tests/statistics/sim.py), with the
default policy (min_samples 2,000, 5-minute checks, cooldown 1h, alpha 0.01, window 24h)
unless said; true ECEs come from the scenario's true probabilities on fresh samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.statistics.sim import (
    DAY,
    T0,
    Delay,
    Scenario,
    Simulation,
    binary,
    sim_config,
    true_ece,
    uniform_delay,
)

ALL = "__all__"
HOUR = 3600.0


@dataclass
class Trace:
    """Events and, every ``step``, the served and raw true ECE of one series."""

    events: list = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)

    def first(self, kind: str, segment: str = ALL) -> float | None:
        ts = [e.ts for e in self.events if e.kind == kind and e.segment == segment]
        return ts[0] if ts else None

    def of(self, kind: str, segment: str = ALL) -> list:
        return [e for e in self.events if e.kind == kind and e.segment == segment]

    def mean_served(self, start: float, end: float) -> float:
        t = np.array(self.times)
        return float(np.mean(np.array(self.served)[(t > start) & (t <= end)]))


def run(sim: Simulation, days: float, step_h: float = 2.0, segment: str = ALL,
        seg: int = 0) -> Trace:
    out = Trace()
    end = sim.t + days * DAY
    while sim.t < end - 1:
        out.events += sim.run(step_h / 24).events
        scores, truth = sim.fresh(sim.t, seg, 20_000, seed=int(sim.t) % 10_000)
        live = sim.policy.live("m", segment)
        out.times.append(sim.t)
        out.served.append(true_ece(None if live is None else live.calibrator, scores, truth))
        out.raw.append(true_ece(None, scores, truth))
    return out


def implicit_negatives(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Clicks are labelled within 20 minutes; the rest become 0 after 30 minutes
    (join.missing_label {value: 0, after: 30m})."""
    return np.where(y == 1, rng.uniform(0, 1200, len(y)), 1800.0)


SHARPEN = binary(mu=-2.0, sd=1.2, change_at=T0 + DAY, scale=2.5)


def _delayed(per_day: float, delay: Delay, seed: int, days: float,
             join: dict | None = None) -> tuple[Simulation, Trace]:
    sim = Simulation(sim_config(min_samples=2000, join=join), SHARPEN, segments=1,
                     per_day=per_day, seed=seed, delay=delay)
    return sim, run(sim, days)


@pytest.mark.slow
def test_labels_6_to_48_hours_late_at_24k_a_day() -> None:
    """Alarm <= 12 h after the change, dated within 1 h, first publish <= 30 h, no alarm
    after a correct publish, served true ECE <= 0.03 at the end and over the last 2 days."""
    change = T0 + DAY
    sim, tr = _delayed(24_000, uniform_delay(6 * HOUR, 48 * HOUR), seed=31, days=5)
    drift, pub = tr.first("drift"), tr.first("published")
    assert drift is not None and pub is not None, tr.events
    dated = tr.of("drift")[0].fields["change_ts"]
    print(f"\n24k/day, labels 6-48 h late: alarm {(drift - change) / HOUR:.1f} h after the "
          f"change, dated {(dated - change) / 60:+.0f} min, published after "
          f"{(pub - change) / HOUR:.1f} h; served true ECE {tr.served[-1]:.4f} at the end, "
          f"{tr.mean_served(sim.t - 2 * DAY, sim.t):.4f} over the last 2 days "
          f"(raw {tr.raw[-1]:.3f}); drift events {len(tr.of('drift'))}")
    assert drift - change <= 12 * HOUR
    assert abs(dated - change) <= HOUR
    assert pub - change <= 30 * HOUR
    assert [e for e in tr.of("drift") if e.ts > pub] == []  # no alarm after it
    assert tr.served[-1] <= 0.03
    assert tr.mean_served(sim.t - 2 * DAY, sim.t) <= 0.03


def test_labels_6_to_48_hours_late_at_8k_a_day() -> None:
    change = T0 + DAY
    _, tr = _delayed(8_000, uniform_delay(6 * HOUR, 48 * HOUR), seed=32, days=4)
    drift, pub = tr.first("drift"), tr.first("published")
    assert drift is not None and pub is not None, tr.events
    dated = tr.of("drift")[0].fields["change_ts"]
    print(f"\n8k/day, labels 6-48 h late: alarm {(drift - change) / HOUR:.1f} h, dated "
          f"{(dated - change) / 60:+.0f} min, published after {(pub - change) / HOUR:.1f} h, "
          f"served {tr.served[-1]:.4f}")
    assert drift - change <= 24 * HOUR
    assert abs(dated - change) <= 2 * HOUR
    assert pub - change <= 36 * HOUR


def test_implicit_negatives_after_30_minutes() -> None:
    change = T0 + DAY
    _, tr = _delayed(24_000, implicit_negatives, seed=33, days=2,
                     join={"missing_label": {"value": 0, "after": "30m"}})
    drift, pub = tr.first("drift"), tr.first("published")
    assert drift is not None and pub is not None, tr.events
    assert drift > change  # a click's label comes first, its 0 later: no false alarm
    print(f"\nimplicit negatives: alarm {(drift - change) / HOUR:.2f} h, published after "
          f"{(pub - change) / HOUR:.1f} h, served {tr.served[-1]:.4f}")
    assert drift - change <= 2 * HOUR
    assert pub - change <= 6 * HOUR
    assert tr.served[-1] <= 0.02


def test_a_sharpening_at_8k_a_day_with_prompt_labels_is_published_within_8_hours() -> None:
    change = T0 + DAY
    sim = Simulation(sim_config(min_samples=2000), SHARPEN, segments=1, per_day=8000, seed=34)
    tr = run(sim, 2)
    pub = tr.first("published")
    assert pub is not None, tr.events
    print(f"\n8k/day prompt: published after {(pub - change) / HOUR:.1f} h, "
          f"served {tr.served[-1]:.4f}")
    assert pub - change <= 8 * HOUR
    assert tr.served[-1] <= 0.03


@pytest.mark.parametrize(("per_hour", "flag_h", "publish_h"), [(1200, 1, 4), (5000 / 24, 4, 24)])
def test_miscalibrated_from_the_start(per_hour: float, flag_h: float, publish_h: float) -> None:
    """The model reports twice its true logits from the first prediction on (T = 2 fixes
    it): flagged and published in time, served true ECE <= 0.03 at the end."""
    sim = Simulation(sim_config(min_samples=2000), binary(mu=-2.0, sd=1.2, change_at=T0,
                                                          scale=2.0),
                     segments=1, per_day=per_hour * 24, seed=35)
    tr = run(sim, publish_h / 24 + 0.5, step_h=1.0)
    drift, pub = tr.first("drift"), tr.first("published")
    assert drift is not None and pub is not None, tr.events
    print(f"\nmiscalibrated from the start at {per_hour:.0f}/h: flagged after "
          f"{(drift - T0) / HOUR:.1f} h, published after {(pub - T0) / HOUR:.1f} h, "
          f"served {tr.served[-1]:.4f} (raw {tr.raw[-1]:.3f})")
    assert drift - T0 <= flag_h * HOUR
    assert pub - T0 <= publish_h * HOUR
    assert tr.served[-1] <= 0.03


def test_a_one_percent_segment_with_a_prior_shift_is_fixed_on_its_own() -> None:
    """Segments of ~400 predictions a day, one with a +1.5 prior shift after a day;
    min_samples 400, per segment: found within a day, served true ECE <= 0.03 three days
    later, no other segment served worse than 0.01 (true ECE)."""
    change = T0 + DAY
    scenario: Scenario = binary(mu=-3.0, change_at=change, shift=1.5, shift_segment=2)
    sim = Simulation(sim_config(min_samples=400, per_segment=True), scenario, segments=5,
                     per_day=400, seed=36)
    tr = run(sim, 4, step_h=6.0, segment="country=c2", seg=2)
    found = tr.first("drift", "country=c2")
    assert found is not None, tr.events
    fixed = tr.served[-1]
    others = []
    for seg in (0, 1, 3, 4):
        scores, truth = sim.fresh(sim.t, seg, 50_000)
        live = sim.policy.live("m", f"country=c{seg}")
        others.append(true_ece(None if live is None else live.calibrator, scores, truth))
    print(f"\n1% segment +1.5: found {(found - change) / HOUR:.1f} h after the change; "
          f"served {fixed:.4f} (raw {tr.raw[-1]:.3f}) 3 days later; others "
          f"{', '.join(f'{v:.4f}' for v in others)}")
    assert found - change <= DAY
    assert fixed <= 0.03
    assert max(others) <= 0.01


@pytest.mark.slow
def test_a_600_a_day_model_with_a_prior_shift_is_fixed_within_5_days() -> None:
    """Default min_samples (2,000): counted since the change on the buffer, they are
    reached in ~3.3 days (the 24 h window never holds them)."""
    change = T0 + DAY
    fixed = 0
    for seed in range(6):
        sim = Simulation(sim_config(min_samples=2000),
                         binary(mu=-3.0, change_at=change, shift=1.0),
                         segments=1, per_day=600, seed=40 + seed)
        events = sim.run(6).events
        pubs = [e.ts for e in events if e.kind == "published"]
        ok = bool(pubs) and pubs[0] - change <= 5 * DAY
        print(f"\n600/day +1.0, seed {seed}: published after "
              f"{(pubs[0] - change) / DAY if pubs else float('nan'):.2f} days")
        fixed += ok
    assert fixed >= 5


def test_a_drift_fixed_upstream_a_day_later_is_rolled_back() -> None:
    """Logits sharpened 2.5x from day 1 (a calibrator is published for it), the model fixed
    upstream at day 2: the stale calibrator is replaced or rolled back within 8 h, and the
    served true ECE over the following day is <= 0.02."""
    sharpened, fixed = T0 + DAY, T0 + 2 * DAY

    def scenario(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(-2.0, 1.2, n)
        return (z * 2.5 if sharpened <= t < fixed else z), 1 / (1 + np.exp(-z))

    sim = Simulation(sim_config(min_samples=2000), scenario, segments=1, per_day=8000, seed=37)
    tr = run(sim, 3, step_h=1.0)
    pubs = tr.of("published")
    assert pubs and pubs[0].ts < fixed, tr.events
    undo = [e for e in pubs if e.ts >= fixed]
    assert undo, tr.events
    after = tr.mean_served(fixed, fixed + DAY)
    print(f"\nfixed upstream: {undo[0].fields['method']} v{undo[0].fields['version']} "
          f"({undo[0].fields['trigger']}) {(undo[0].ts - fixed) / HOUR:.1f} h after the fix; "
          f"served true ECE over the next day {after:.4f}")
    assert undo[0].ts - fixed <= 8 * HOUR
    assert after <= 0.02


def test_a_gradual_drift_is_followed() -> None:
    """Logits sharpened gradually, x1 -> x2 over 3 days from day 1, at 8k a day: flagged
    while the raw model's true ECE is still <= 0.06; the served true ECE averaged over
    the drift is at most half the raw model's, and <= 0.03 at the end."""
    start, span = T0 + DAY, 3 * DAY

    def scenario(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(-2.0, 1.2, n)
        return z * (1.0 + min(max((t - start) / span, 0.0), 1.0)), 1 / (1 + np.exp(-z))

    sim = Simulation(sim_config(min_samples=2000), scenario, segments=1, per_day=8000, seed=38)
    tr = run(sim, 4.5, step_h=2.0)
    drift = tr.first("drift")
    assert drift is not None, tr.events
    t = np.array(tr.times)
    raw_at_flag = float(np.interp(drift, t, tr.raw))
    during = (t > start) & (t <= start + span)
    served, raw = float(np.mean(np.array(tr.served)[during])), float(
        np.mean(np.array(tr.raw)[during]))
    print(f"\ngradual x1 -> x2: flagged {(drift - start) / HOUR:.1f} h in (raw true ECE "
          f"{raw_at_flag:.3f}); over the drift served {served:.4f} vs raw {raw:.4f}; "
          f"{len(tr.of('published'))} publishes; at the end {tr.served[-1]:.4f}")
    assert raw_at_flag <= 0.06
    assert served <= 0.5 * raw
    assert tr.served[-1] <= 0.03
