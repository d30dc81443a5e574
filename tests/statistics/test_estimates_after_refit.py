"""Estimated accuracy after a prior-shift refit (issue 23): the label-free estimate is
the calibrated probability that the MODEL's predicted class is right (its decision is
what serving acts on), so it lands within 0.02 of the accuracy the held-back labels
show. The calibrator comes from calmon's own refit on labelled post-shift samples; the
truth (realized accuracy) is plain numpy on labels drawn from known probabilities.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from calmon.config import from_dict
from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.recal.refit import apply_or_identity, refit
from tests.oracle import T0, P

SHIFT = 1.5  # the true log-odds are the model's plus 1.5 (a prior shift)


def test_estimated_accuracy_after_a_prior_shift_refit_is_within_0_02() -> None:
    rng = np.random.default_rng(17)
    n_fit = 6000
    z_fit = rng.normal(0.5, 1.5, n_fit)
    y_fit = (rng.random(n_fit) < expit(z_fit)).astype(np.int64)
    samples = SampleSet(T0 + np.arange(n_fit, dtype=float), y_fit, np.ones(n_fit, np.int8),
                        z_fit - SHIFT)
    r = refit(samples, "temperature", None, 0.3, 15)
    assert r.outcome == "published" and r.calibrator is not None
    cal = r.calibrator

    engine = Engine(from_dict({"metrics": {"windows": ["1h", "24h"]}}))
    engine.set_calibrators({("m", "__all__"): (
        lambda scores, kind: apply_or_identity(cal, scores, kind), None)})
    n = 8000
    z = rng.normal(0.5, 1.5, n)
    reported = z - SHIFT
    y = (rng.random(n) < expit(z)).astype(int)  # held back: the labels never arrive
    ts = T0 + 3600 + np.sort(rng.uniform(0, 1800, n))
    engine.feed([P(f"p{i}", float(ts[i]), logit=float(reported[i])) for i in range(n)])
    est = next(row.estimates for row in full_snapshot(engine).rows if row.model == "m")
    realized = float(((reported >= 0).astype(int) == y).mean())  # the model's own decision
    q = expit(reported + SHIFT)
    scored_by_calibrator = float(np.maximum(q, 1 - q).mean())  # the old, wrong reading
    print(f"\nestimated accuracy {est.estimated_accuracy:.3f}, realized {realized:.3f} "
          f"(the calibrator's own class would say {scored_by_calibrator:.3f})")
    assert est.pending_samples == n
    assert abs(est.estimated_accuracy - realized) <= 0.02
    assert abs(scored_by_calibrator - realized) > 0.05  # the scenario tells them apart
    assert abs(est.estimated_positive_rate - y.mean()) <= 0.02
