"""The names several layers mean the same by, spelt once, below all of them.

Config validates against them, the engine counts by them, the calibrators and the
exporter read and write them; none of those may import another for a name, so they
live here (with the two score links every layer computes alike). Nothing of calmon
is imported: this is the bottom of ARCHITECTURE.md's layer table.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, get_args

import numpy as np

ALL: Final = "__all__"
"""The segment of a model's whole series (every record, whatever its segment)."""

BUCKETS: Final = 16
"""Each sliding window is a ring of this many event-time buckets (engine/windows.py);
what a window, a model's class history and check-config's worst case count in."""


class ScoreKind(enum.IntEnum):
    """How a prediction gives its score. The int is what arrays of kinds hold; the
    kinds below ``PROBS`` are binary (scored on P(y=1))."""

    PROB = 0
    LOGIT = 1
    PROBS = 2
    LOGITS = 3


SCORE_KINDS: Final = tuple(k.name.lower() for k in ScoreKind)  # field names: prob, logit, ...
BINARY_KINDS: Final = SCORE_KINDS[:ScoreKind.PROBS]
MULTICLASS_KINDS: Final = SCORE_KINDS[ScoreKind.PROBS:]

FitMethod = Literal["temperature", "platt", "isotonic", "histogram"]
FIT_METHODS: Final[tuple[str, ...]] = get_args(FitMethod)
"""What fits, and what ``recalibration.method: auto`` tries (identity only rolls back)."""

# ---------------------------------------------------------------- metric families
# By their names without ``calmon_``: what metrics.export.families and segment_families
# may name. io/exporter.py writes them (with their help and types); a test holds the two
# together.

ROW_FAMILIES: Final = (
    "ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence", "observed_rate",
    "observed_over_expected", "ece_noise_floor", "ece_l2_debiased", "smece", "ece_lower",
    "ece_upper")
"""The per-window families of a series' statistics."""
ESTIMATE_FAMILIES: Final = (
    "pending_samples", "estimated_accuracy", "estimated_positive_rate", "score_psi",
    "estimated_accuracy_lower", "estimated_accuracy_upper", "estimated_correct",
    "estimated_correct_variance")
"""The per-window families of a series' label-free estimates."""
SERIES_GAUGES: Final = (
    "calibrator_temperature", "drift_evidence", "drift_change_timestamp_seconds")
"""Per (model, segment) gauges the export policy filters too."""
SERIES_FAMILIES: Final = (
    "window_samples", *ROW_FAMILIES, *ESTIMATE_FAMILIES, "classwise_ece", "calibrated_ece",
    "calibrated_samples", *SERIES_GAUGES)
"""Every family a (model, segment[, window]) series may carry that the policy filters."""
UNFILTERED_FAMILIES: Final = (
    "bin_samples_total", "bin_confidence_total", "bin_correct_total", "predictions_total",
    "labels_total", "joined_total", "class_resets_total", "join_expired_total",
    "labels_expired_total", "duplicates_total", "invalid_records_total", "join_pending",
    "label_delay_seconds", "recalibrations_total", "calibrator_version", "drift",
    "alerts_failed_total", "dead_letters_failed_total", "last_checkpoint_timestamp_seconds",
    "statistics_age_seconds", "build_info", "consumer_lag_records",
    "loop_heartbeat_timestamp_seconds", "recalibration_owned_models",
    "tasks", "restore_seconds", "restored_bytes_total")  # v4: group mode (§8)
"""Never filtered (counters, drift, versions, recalibration outcomes, the families without
a series): known names, so a config may list them."""
FAMILIES: Final = SERIES_FAMILIES + UNFILTERED_FAMILIES

# ---------------------------------------------------------------- score links

FINITE: Final = 1e300  # last-resort clip before exp: keeps z/T or a*z+b overflows finite


def sigmoid(z: np.ndarray) -> np.ndarray:
    """P(y=1) of log-odds ``z``; finite for any input (never exp of a large number)."""
    z = np.clip(z, -FINITE, FINITE)
    e = np.exp(-np.abs(z))  # in (0, 1]: never overflows
    return np.asarray(np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e)))


def softmax(z: np.ndarray) -> np.ndarray:
    """Rows of probabilities of logits ``z`` (n, K), the row maximum subtracted first."""
    z = np.clip(z, -FINITE, FINITE)
    e = np.exp(z - z.max(axis=1, keepdims=True))  # largest term is exp(0) = 1: no overflow
    return np.asarray(e / e.sum(axis=1, keepdims=True))
