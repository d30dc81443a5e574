"""The model's own decision in realized and estimated accuracy (issue 39, contract v5
§2), with a known truth: a fraud model that acts at p >= 0.1 (its decision given in
the records, or left to ``models.<m>.threshold: 0.1``), whose scores under-state its
confidence (true logit 1.3x the reported one). The estimate of its pending
predictions holds for the decisions it makes (within 4 sqrt(a (1 - a) / n_fit) +
0.002 of the expected accuracy, the mean true probability of the decided class), far
from the accuracy of p >= 0.5; once their labels come, realized accuracy equals
numpy's mean(decision == label) to 1e-9."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, label_bytes, pred_bytes

N_FIT, N_PENDING = 40_000, 5_000


def stream(rng: np.random.Generator, n: int, start: float, prefix: str, given: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[Raw], list[Raw]]:
    """(reported p, true p, decision, y, predictions, labels), the decision p >= 0.1 given
    in every other record when ``given`` (else left to the threshold)."""
    z = rng.normal(-2.0, 1.5, n)
    p, truth = expit(z), expit(1.3 * z)
    y = (rng.random(n) < truth).astype(int)
    d = (p >= 0.1).astype(int)
    preds, labels = [], []
    for i in range(n):
        extra = {"decision": bool(d[i])} if given and i % 2 else {}
        preds.append(Raw(Kind.PREDICTION, pred_bytes(f"{prefix}{i}", start + i * 0.01,
                                                     logit=float(z[i]), **extra)))
        labels.append(Raw(Kind.LABEL, label_bytes(f"{prefix}{i}", int(y[i]),
                                                  start + i * 0.01 + 1)))
    return p, truth, d, y, preds, labels


@pytest.mark.parametrize("given", [False, True])
def test_the_estimate_and_the_accuracy_are_of_the_decisions_made(given: bool) -> None:
    rng = np.random.default_rng(91 + given)
    engine = Engine(from_dict({
        "metrics": {"windows": ["1h", "24h"]}, "recalibration": {"window": "24h"},
        "fields": {"decision": "decision"}, "models": {"*": {"threshold": 0.1}},
        "estimates": {"min_samples": 1000, "samples": 50_000}}))
    fit = stream(rng, N_FIT, T0, "a", given)
    engine.feed(fit[4] + fit[5])
    p, truth, d, y, preds, labels = stream(rng, N_PENDING, T0 + N_FIT * 0.01 + 5, "b", given)
    engine.feed(preds)

    def row():  # type: ignore[no-untyped-def]
        [r] = [r for r in full_snapshot(engine).rows
               if (r.model, r.segment, r.window) == ("m", "__all__", "24h")]
        return r

    est = row().estimates
    assert est.estimate_basis == "series" and est.pending_samples == N_PENDING
    expected = float(np.mean(np.where(d == 1, truth, 1 - truth)))
    tol = 4 * np.sqrt(expected * (1 - expected) / N_FIT) + 0.002
    assert abs(est.estimated_accuracy - expected) <= tol
    at_half = float(np.mean(np.where(p >= 0.5, truth, 1 - truth)))
    assert abs(at_half - expected) > 10 * tol  # the rule it does not act on is far off
    engine.feed(labels)
    # realized: every joined sample, the fit's and the pending ones'
    want = float(np.mean(np.concatenate([fit[2], d]) == np.concatenate([fit[3], y])))
    assert row().stats.accuracy == pytest.approx(want, abs=1e-9)
