"""The identity: the model's own probabilities. What a rollback publishes when no
calibrator is the right answer (contract section 6, v3: ``method: identity``), so
serving code that follows the documents stops applying the stale one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from calmon.calibrators.base import Calibrator, check_params
from calmon.calibrators.scores import to_probs
from calmon.errors import CalibratorError


class IdentityCalibrator(Calibrator):
    method = "identity"
    param_names = ()

    def _apply(self, scores: np.ndarray) -> np.ndarray:
        return to_probs(scores, self.input)

    @classmethod
    def _fit(cls, scores: np.ndarray, labels: np.ndarray, input: str, **options: Any) -> Self:
        if options:
            raise CalibratorError(f"identity takes no options, got {sorted(options)}")
        return cls(input)

    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        check_params(params, cls)
        return cls(input)
