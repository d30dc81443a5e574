"""Backtest work (issue 39): passing over the series that gained no labelled sample
changes no outcome. The earlier statistics scenarios that raise events, run twice on
the same seed: as the policy runs them (idle series skipped in O(1), series not named
new passed over unread) and with every series taken down the full path of a check
(what every check did before the skip). Their events, as JSON, are byte for byte the
same, and so is the live calibrator each series ends with."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
from scipy.special import softmax

from calmon.engine.buffer import SampleSet
from calmon.recal import policy as policy_mod
from calmon.recal import skip
from tests.statistics.sim import DAY, T0, Simulation, binary, sim_config

K = 5


def full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every series of every check down the full path: none idle, none passed over."""
    monkeypatch.setattr(policy_mod, "idle", lambda *_a: False)
    monkeypatch.setattr(skip.Untouched, "candidate_set",
                        lambda _self, keys, _new, _generation, _states: keys)


def multiclass_segment(t: float, seg: int, n: int, rng: np.random.Generator):
    """test_multiclass: +2.0 on class 2's true logit in country c1 after a day."""
    z = rng.normal(0.0, 1.5, (n, K))
    shift = 2.0 * np.eye(K)[2] if t >= T0 + DAY and seg == 1 else np.zeros(K)
    return z, softmax(z + shift, axis=1)


# (name, a fresh run's events as JSON and each series' live calibrator)
SCENARIOS: dict[str, Callable[[], Simulation]] = {
    # test_backtest (b): a prior shift after a day, one series
    "prior shift": lambda: Simulation(
        sim_config(), binary(mu=-3.0, change_at=T0 + DAY, shift=1.5), 1, 5000, seed=11),
    # test_backtest (c): a prior shift in one of five segments, per-segment
    "segment shift": lambda: Simulation(
        sim_config(per_segment=True),
        binary(mu=-3.0, change_at=T0 + DAY, shift=1.5, shift_segment=2), 5, 5000, seed=3),
    # test_multiclass: a class prior shift in one of four segments
    "multiclass segment": lambda: Simulation(
        sim_config(per_segment=True), multiclass_segment, 4, 6000, seed=3),
}


def outcome(make: Callable[[], Simulation], days: float) -> tuple[str, str]:
    sim = make()
    run = sim.run(days)
    events = json.dumps([e.as_dict() for e in run.events], sort_keys=True)
    live = {f"{m}/{s}": (None if (c := sim.policy.live(m, s)) is None else c.doc)
            for m, s in sim.series()}
    return events, json.dumps(live, sort_keys=True, default=str)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_skipping_idle_series_changes_no_event(name: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    skipped = outcome(SCENARIOS[name], 2.5)
    full_path(monkeypatch)
    full = outcome(SCENARIOS[name], 2.5)
    kinds = [e["kind"] for e in json.loads(skipped[0])]
    print(f"\n{name}: {kinds}")
    assert "drift" in kinds and "published" in kinds  # a scenario with something to decide
    assert skipped[0] == full[0]
    assert skipped[1] == full[1]


def test_the_patch_takes_every_series_down_the_full_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above means something: with nothing new a check passes over every
    series unread, and patched it reads each one's ring."""
    sim = Simulation(sim_config(per_segment=True), binary(mu=-1.0, sd=1.0), 3, 2000, seed=1)
    sim.run(0.5)
    read: list[tuple[str, str]] = []

    def counted(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        read.append((model, segment))
        return sim.samples_of(model, segment, last)

    sim.policy.check_each(lambda _m: sim.t, sim.series(), counted, new=set())
    assert read == []
    full_path(monkeypatch)
    sim.policy.check_each(lambda _m: sim.t, sim.series(), counted, new=set())
    assert sorted(set(read)) == sorted(sim.series())
