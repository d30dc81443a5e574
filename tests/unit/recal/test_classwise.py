"""Multiclass pieces of the recalibration loop (issue 24): the classwise trigger, the
samples' classwise ECE, and the detector's one-class tilt alternatives, each checked
against a computation written here with numpy/scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax

from calmon.config import RecalibrationConfig, Triggers
from calmon.engine.metrics import Bins, classwise_ece_from_samples
from calmon.recal.detect import ALTERNATIVES, TILTS, Detector, change_point, tilt_log_lr
from calmon.recal.triggers import Reading, decide

B = Bins(np.array([100.0]), np.array([90.0]), np.array([90.0]))  # top-label ECE 0


def test_classwise_trigger_fires_over_its_threshold_only_when_read() -> None:
    cfg = RecalibrationConfig(triggers=Triggers(ece_above=0.05, ece_increase=None,
                                                observed_over_expected=None,
                                                classwise_ece_above=0.04))
    assert decide(cfg, Reading(B, False, None, 0.05)).fired == ("classwise_ece_above",)
    assert decide(cfg, Reading(B, False, None, 0.03)).fired == ()
    assert decide(cfg, Reading(B, False, None, None)).fired == ()  # metrics.classwise off
    off = RecalibrationConfig(triggers=Triggers(0.05, None, None))  # null: off
    assert decide(off, Reading(B, False, None, 0.5)).fired == ()
    # the classwise trigger alone is an effect-size trigger: no "evidence" fallback
    only = RecalibrationConfig(triggers=Triggers(None, None, None, classwise_ece_above=0.1))
    assert decide(only, Reading(B, False, None, 0.05)).fired == ()


def test_classwise_ece_of_samples() -> None:
    rng = np.random.default_rng(3)
    probs = softmax(rng.normal(0, 2, (5000, 4)), axis=1)
    labels = rng.integers(0, 4, 5000)
    mean, per = classwise_ece_from_samples(probs, labels, 10)
    expected = []
    for c in range(4):
        p, y = probs[:, c], labels == c
        b = np.clip(np.ceil(p * 10).astype(int) - 1, 0, 9)
        expected.append(sum(abs(p[b == i].sum() - y[b == i].sum()) for i in range(10)) / 5000)
    np.testing.assert_allclose(per, expected, rtol=1e-12)
    assert mean == pytest.approx(np.mean(expected), rel=1e-12)


def test_tilt_ratios_are_q_over_p_and_average_one_under_the_null() -> None:
    rng = np.random.default_rng(4)
    k = 3
    p = softmax(rng.normal(0, 2, (6, k)), axis=1)
    y = rng.integers(0, k, 6)
    ll = tilt_log_lr(p, y)
    assert ll is not None and ll.shape == (k * len(TILTS), 6)
    for c in range(k):
        for j, d in enumerate(TILTS):
            q = softmax(np.log(p) + d * np.eye(k)[c], axis=1)
            np.testing.assert_allclose(ll[c * len(TILTS) + j],
                                       np.log(q[np.arange(6), y] / p[np.arange(6), y]),
                                       rtol=1e-9, atol=1e-12)
            # E_{y ~ p}[q_y / p_y] = 1 exactly, for every row
            mean = sum(p[:, lab] * np.exp(tilt_log_lr(p, np.full(6, lab))[c * len(TILTS) + j])
                       for lab in range(k))
            np.testing.assert_allclose(mean, 1.0, rtol=1e-12)
    assert tilt_log_lr(p[:, 0], y) is None  # binary: none
    wide = tilt_log_lr(np.full((2, 1000), 1 / 1000), np.zeros(2, int))  # every class
    assert wide is not None and wide.shape == (1000 * len(TILTS), 2)


def test_the_detector_takes_tilts_on_its_first_batch_and_survives_batches_without() -> None:
    rng = np.random.default_rng(5)
    p = softmax(rng.normal(0, 1.5, (50, 5)), axis=1)
    y = rng.integers(0, 5, 50)
    conf, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
    d = Detector.new()
    d.update(conf, correct, math.log(100), tilt_log_lr(p, y))
    assert d.off.shape == (len(ALTERNATIVES) + 5 * len(TILTS),)
    d.update(conf, correct, math.log(100))  # no tilts: ratio 1 for them, nothing breaks
    d.update(conf, correct, math.log(100), tilt_log_lr(p[:, :3] / p[:, :3].sum(1, keepdims=True),
                                                       np.minimum(y, 2)))  # another K
    assert d.k == 150 and np.isfinite(d.log_m)
    again = Detector.restore(d.snapshot())
    np.testing.assert_array_equal(again.log_p, d.log_p)
    assert again.log_m == d.log_m
    bad = d.snapshot() | {"off": [0.0] * (len(ALTERNATIVES) + 3)}
    assert Detector.restore(bad).off.shape == (len(ALTERNATIVES),)  # not a grid of ours


def test_change_point_reads_the_tilts() -> None:
    """A prior shift on class 2 starting at sample 300: the tilts date it; the samples'
    top-label confidence alone hardly can."""
    rng = np.random.default_rng(6)
    z = rng.normal(0, 1.5, (600, 5))
    p = softmax(z, axis=1)
    truth = p.copy()
    truth[300:] = softmax(z[300:] + 2.5 * np.eye(5)[2], axis=1)
    u = rng.random(600)
    y = np.minimum((np.cumsum(truth, axis=1) < u[:, None]).sum(axis=1), 4)
    conf, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
    k = change_point(conf, correct, tilt_log_lr(p, y))
    assert abs(k - 300) <= 40
