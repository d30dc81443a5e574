"""Post-hoc calibrators: fit on (scores, labels), apply to scores, publish as JSON.

Pure numpy. Score kinds (``input``): "prob" (binary P(y=1), shape (n,)), "logit" (binary
log-odds, (n,)), "probs" ((n, K) class probabilities), "logits" ((n, K) class logits).

    cal = fit("temperature", logits, labels, input="logits")
    cal.apply(new_logits)                       # (n, K) calibrated probabilities
    doc = cal.to_json(model="m", version=1)     # contract section 6
    load(doc).apply(new_logits)                 # identical outputs

Documents are checked before use (calibrators.validate) and may be signed
(calibrators.signing); CalibratorWatcher follows a directory or topic of them.
The format: docs/calibrator-format.md.
"""

from calmon.calibrators.base import Calibrator
from calmon.calibrators.histogram import HistogramCalibrator
from calmon.calibrators.isotonic import IsotonicCalibrator
from calmon.calibrators.platt import PlattCalibrator
from calmon.calibrators.registry import METHODS, fit, load
from calmon.calibrators.scores import INPUTS, to_probs
from calmon.calibrators.temperature import TemperatureCalibrator
from calmon.calibrators.watcher import CalibratorWatcher
from calmon.errors import CalibratorError

__all__ = [
    "INPUTS",
    "METHODS",
    "Calibrator",
    "CalibratorError",
    "CalibratorWatcher",
    "HistogramCalibrator",
    "IsotonicCalibrator",
    "PlattCalibrator",
    "TemperatureCalibrator",
    "fit",
    "load",
    "to_probs",
]
