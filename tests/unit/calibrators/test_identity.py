"""``method: identity``: what a rollback publishes when no calibrator is the right answer
(contract section 6, v3). It loads like any document and serves the model's own
probabilities, computed here with scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import METHODS, CalibratorError, load


def doc(input: str, params: dict | None = None) -> dict:
    return {"model": "m", "segment": "__all__", "version": 3, "method": "identity",
            "params": {} if params is None else params, "input": input}


def test_identity_serves_the_models_own_probabilities() -> None:
    z = np.array([-3.0, 0.0, 2.5])
    np.testing.assert_allclose(load(doc("logit")).apply(z), expit(z), rtol=1e-12)
    zz = np.array([[0.0, 1.0, -1.0], [2.0, 0.5, 0.1]])
    np.testing.assert_allclose(load(doc("logits")).apply(zz), softmax(zz, axis=1), rtol=1e-9)


def test_identity_takes_no_params_and_is_no_fitting_method() -> None:
    with pytest.raises(CalibratorError):
        load(doc("logit", {"temperature": 1.0}))
    assert "identity" not in METHODS
