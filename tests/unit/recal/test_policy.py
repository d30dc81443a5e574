"""Policy decisions that need no stream: the alpha split and the deferral rule."""

from __future__ import annotations

import math

from calmon import config as config_mod
from calmon.engine.series import ALL
from calmon.recal.detect import Detector
from calmon.recal.policy import Policy, SeriesState
from calmon.recal.registry import Registry


def policy(per_segment: bool) -> Policy:
    cfg = config_mod.from_dict({
        "segments": {"slices": [["country"], ["device"], ["country", "device"]],
                     "max_values": 10},
        "recalibration": {"per_segment": per_segment, "alpha": 0.01}})
    return Policy(cfg, Registry(None))


def test_alpha_is_split_over_every_series_a_model_can_have() -> None:
    assert policy(False).series_budget() == 1
    p = policy(True)
    assert p.series_budget() == 1 + 11 + 11 + 11 * 11
    assert math.isclose(p.log_threshold(), math.log(p.series_budget() / 0.01))


def test_a_model_level_refit_waits_while_a_minority_of_a_slice_drifts() -> None:
    p = policy(True)
    countries = [f"country={c}" for c in "ABCDE"]
    devices = ["device=ios", "device=web"]
    keys = [("m", ALL)] + [("m", s) for s in countries + devices]

    def drifting(*segments: str) -> None:
        p.states = {("m", s): SeriesState(Detector.new(), (None, None),
                                          drifting=("ece_above",) if s in segments else ())
                    for s in countries + devices}

    drifting()
    assert not p._deferred("m", ALL, keys)  # nothing local: the model may refit
    drifting("country=C")
    assert p._deferred("m", ALL, keys)  # one country of five: local
    drifting("country=C", "device=ios")
    assert p._deferred("m", ALL, keys)  # still a minority of the countries
    drifting("country=A", "country=B", "country=C", "device=ios", "device=web")
    assert not p._deferred("m", ALL, keys)  # most of every slice: a global drift
    assert not p._deferred("m", "country=C", keys)  # segments never wait
    p.registry.publish({"model": "m", "segment": "country=D", "method": "temperature",
                        "params": {"temperature": 1.0}, "input": "logit"})
    drifting()
    assert p._deferred("m", ALL, keys)  # a segment with its own calibrator: local


def test_a_latched_alarm_survives_a_checkpoint() -> None:
    """The latch (what fired, when the drift event went out) is in the series' snapshot;
    a snapshot of an older version (no latch) restores unlatched."""
    from calmon.recal.latch import Latch

    st = SeriesState(Detector.new(), (None, None), announced=True,
                     latch=Latch(("ece_above",), 1000.0))
    back = SeriesState.restore(st.snapshot())
    assert back.latch == Latch(("ece_above",), 1000.0)
    assert back.latch.hold(()) == ("ece_above",)
    assert back.latch.hold(("observed_over_expected",)) == ("observed_over_expected",)
    assert not back.latch.expired(1000.0 + 3599.0, 3600.0)
    assert back.latch.expired(1000.0 + 3600.0, 3600.0)
    st.regime_from = 900.0  # after a held refit (v4): the next fit starts there
    assert SeriesState.restore(st.snapshot()).regime_from == 900.0
    old = st.snapshot()
    del old["latch"], old["regime_from"]
    assert SeriesState.restore(old).latch == Latch()
    assert SeriesState.restore(old).regime_from is None
    assert not Latch().expired(1e12, 1.0)
