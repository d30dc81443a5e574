"""The tests' one oracle: reference computations and record builders.

Everything here is written from the contract's definitions (CONTRACT.md section 2)
with plain numpy / scipy, never with calmon's own functions, so a test that
compares calmon against it can fail. Every test that needs an ECE, the right-closed
bins or a per-bin sum takes it from here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit, softmax

from calmon.engine.records import Kind, Raw

T0 = 1_764_460_800.0  # 2025-11-30T00:00:00Z, a multiple of 225 s, 5400 s and 86400 s


# ---------------------------------------------------------------- records


def pred_bytes(pid: str, ts: float, model: str = "m", **fields: Any) -> bytes:
    """A prediction record: ``fields`` holds the score (prob=..., probs=[...], ...)
    and optionally segment=..."""
    return json.dumps({"id": pid, "model": model, "ts": ts, **fields}).encode()


def label_bytes(lid: str, label: Any, ts: float | None = None, **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": lid, "label": label, **extra}
    if ts is not None:
        obj["ts"] = ts
    return json.dumps(obj).encode()


def logit_records(ids: list[str], ts: np.ndarray, logit: np.ndarray, model: str = "m",
                  labels: np.ndarray | None = None, label_delay: float = 60.0,
                  segment: dict[str, str] | None = None) -> list[Raw]:
    """Many logit predictions (``logit`` (n,): binary ``logit``; (n, K): ``logits``),
    each of ``segment`` when given, and with ``labels`` each one's label ``label_delay``
    s later, right after it: the bytes ``pred_bytes`` and ``label_bytes`` write, built
    without a dict and a json.dumps per record (ids plain ASCII, no escaping; floats in
    json's own repr). The first record of each kind is checked against them."""
    t, z = np.asarray(ts, np.float64).tolist(), np.asarray(logit, np.float64).tolist()
    name = "logit" if np.ndim(logit) == 1 else "logits"
    score = [repr(b) if name == "logit" else f"[{', '.join(map(repr, b))}]" for b in z]
    seg = "" if segment is None else f', "segment": {json.dumps(segment)}'
    preds = [f'{{"id": "{i}", "model": "{model}", "ts": {a!r}, "{name}": {b}{seg}}}'.encode()
             for i, a, b in zip(ids, t, score, strict=True)]
    if ids:
        first = {name: z[0]} | ({} if segment is None else {"segment": segment})
        assert preds[0] == pred_bytes(ids[0], t[0], model, **first), preds[0]
    if labels is None:
        return [Raw(Kind.PREDICTION, v) for v in preds]
    y = np.asarray(labels).astype(np.int64).tolist()
    lab = [f'{{"id": "{i}", "label": {c}, "ts": {a + label_delay!r}}}'.encode()
           for i, c, a in zip(ids, y, t, strict=True)]
    if ids:
        assert lab[0] == label_bytes(ids[0], y[0], t[0] + label_delay), lab[0]
    out: list[Raw] = []
    for v, w in zip(preds, lab):
        out += (Raw(Kind.PREDICTION, v), Raw(Kind.LABEL, w))
    return out


def P(pid: str, ts: float, model: str = "m", **fields: Any) -> Raw:
    return Raw(Kind.PREDICTION, pred_bytes(pid, ts, model, **fields))


def L(lid: str, label: Any, ts: float | None = None, **extra: Any) -> Raw:
    return Raw(Kind.LABEL, label_bytes(lid, label, ts, **extra))


# ---------------------------------------------------------------- per-sample values


@dataclass
class PerSample:
    """Per-sample terms of the contract's definitions."""

    conf: np.ndarray  # binary: P(y=1); multiclass: top-label probability
    correct: np.ndarray  # binary: y; multiclass: argmax == y
    acc: np.ndarray  # binary: [p >= 0.5] == y; multiclass: argmax == y
    brier: np.ndarray
    nll: np.ndarray
    binary: bool


def binary_terms(p: np.ndarray, y: np.ndarray) -> PerSample:
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    p_true = np.where(y == 1, p, 1.0 - p)
    return PerSample(
        conf=p,
        correct=y.astype(np.float64),
        acc=((p >= 0.5).astype(np.int64) == y).astype(np.float64),
        brier=(p - y) ** 2,
        nll=-np.log(np.clip(p_true, 1e-15, 1.0)),
        binary=True,
    )


def binary_from_logits(z: np.ndarray, y: np.ndarray) -> PerSample:
    return binary_terms(expit(np.asarray(z, dtype=np.float64)), y)


def multiclass_terms(probs: np.ndarray, y: np.ndarray) -> PerSample:
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum(axis=1, keepdims=True)  # the contract renormalises
    y = np.asarray(y, dtype=np.int64)
    rows = np.arange(len(y))
    top = probs.max(axis=1)
    hit = (probs.argmax(axis=1) == y).astype(np.float64)
    onehot = np.zeros_like(probs)
    onehot[rows, y] = 1.0
    return PerSample(
        conf=top,
        correct=hit,
        acc=hit,
        brier=((probs - onehot) ** 2).sum(axis=1),
        nll=-np.log(np.clip(probs[rows, y], 1e-15, 1.0)),
        binary=False,
    )


def multiclass_from_logits(z: np.ndarray, y: np.ndarray) -> PerSample:
    return multiclass_terms(softmax(np.asarray(z, dtype=np.float64), axis=1), y)


# ---------------------------------------------------------------- binning


def right_closed_bins(conf: np.ndarray, bins: int) -> np.ndarray:
    """Bin i holds (e_i, e_{i+1}], bin 0 also holds 0, with e = np.linspace(0, 1, B + 1)
    as scikit-learn's ``calibration_curve`` (for B = 15, e_k == k / 15 for every k).
    Written as one mask per bin, so it does not share code with a searchsorted."""
    conf = np.asarray(conf, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = np.full(conf.shape, -1, dtype=np.int64)
    for i in range(bins):
        inside = (conf > edges[i]) & (conf <= edges[i + 1])
        if i == 0:
            inside |= conf == 0.0
        assert not (out[inside] >= 0).any()
        out[inside] = i
    assert (out >= 0).all(), "a confidence outside [0, 1]"
    return out


def per_bin(conf: np.ndarray, correct: np.ndarray, bins: int):
    idx = right_closed_bins(conf, bins)
    count = np.array([(idx == i).sum() for i in range(bins)], dtype=np.float64)
    csum = np.array([conf[idx == i].sum() for i in range(bins)])
    ksum = np.array([correct[idx == i].sum() for i in range(bins)])
    return count, csum, ksum


def ece_from_bins(count, csum, ksum, mce_min_samples: int = 30) -> tuple[float, float | None]:
    """(ECE, MCE) from per-bin count / confidence sum / correct sum; MCE over bins with
    at least ``mce_min_samples`` samples, None when there is none."""
    n = count.sum()
    ece = 0.0
    mce = None
    for nb, cb, kb in zip(count, csum, ksum):
        if nb == 0:
            continue
        gap = abs(cb / nb - kb / nb)
        ece += nb / n * gap
        if nb >= mce_min_samples:
            mce = gap if mce is None else max(mce, gap)
    return ece, mce


def l2_debiased(count, csum, ksum) -> float:
    """Kumar et al. 2019, as the contract spells it, one bin at a time."""
    n = count.sum()
    total = 0.0
    for nb, cb, kb in zip(count, csum, ksum):
        if nb < 2:
            continue
        acc = kb / nb
        total += nb / n * ((acc - cb / nb) ** 2 - acc * (1 - acc) / (nb - 1))
    return math.sqrt(max(total, 0.0))


def ace(conf: np.ndarray, correct: np.ndarray, bins: int, fine_bins: int) -> float:
    """Contract: count confidences in ``fine_bins`` right-closed equal-width fine bins;
    a group closes after the first fine bin where the running count reaches k*N/B
    (k = 1..B-1); the last group runs to the last fine bin. ACE is the ECE sum over
    the groups."""
    fidx = right_closed_bins(conf, fine_bins)
    n = len(conf)
    groups: list[list[int]] = []
    current: list[int] = []
    running = 0
    k = 1
    for j in range(fine_bins):
        current.append(j)
        running += int((fidx == j).sum())
        closes = False
        while k < bins and running * bins >= k * n:  # running >= k*N/B, exactly
            closes = True
            k += 1
        if closes:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    total = 0.0
    for g in groups:
        member = np.isin(fidx, g)
        ng = member.sum()
        if ng:
            total += ng / n * abs(conf[member].mean() - correct[member].mean())
    return total


# ---------------------------------------------------------------- window metrics


def expected_row(s: PerSample, bins: int, fine_bins: int,
                 mce_min_samples: int = 30) -> dict[str, float | int | None]:
    n = len(s.conf)
    count, csum, ksum = per_bin(s.conf, s.correct, bins)
    ece, mce = ece_from_bins(count, csum, ksum, mce_min_samples)
    return {
        "samples": n,
        "ece": ece,
        "mce": mce,
        "ece_l2_debiased": l2_debiased(count, csum, ksum),
        "ace": ace(s.conf, s.correct, bins, fine_bins),
        "brier": float(s.brier.mean()),
        "nll": float(s.nll.mean()),
        "accuracy": float(s.acc.mean()),
        "mean_confidence": float(s.conf.mean()),
        "observed_rate": float(s.correct.mean()) if s.binary else None,
        "observed_over_expected": (float(s.correct.sum() / s.conf.sum()) if s.binary
                                   else None),
    }


def concat(parts: list[PerSample]) -> PerSample:
    return PerSample(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("conf", "correct", "acc", "brier", "nll")),
                     binary=parts[0].binary)


def monte_carlo_floor(count: np.ndarray, mean_conf: np.ndarray, draws: int,
                      rng: np.random.Generator) -> float:
    """Mean ECE of a perfectly calibrated model: the labels of bin b are
    Bernoulli(mean_conf_b) draws; their sum over the bin's n_b samples is drawn as
    one Binomial(n_b, mean_conf_b), which has the same distribution."""
    nz = count > 0
    nb = count[nz].astype(np.int64)
    pb = mean_conf[nz]
    x = rng.binomial(nb, pb, size=(draws, len(nb)))
    ece = (np.abs(x / nb - pb) * nb).sum(axis=1) / nb.sum()
    return float(ece.mean())


def assert_close(actual: Any, expected: Any, tol: float, what: str) -> None:
    if expected is None:
        assert actual is None, f"{what}: expected null, got {actual!r}"
        return
    assert actual is not None, f"{what}: got null, expected {expected!r}"
    assert math.isfinite(actual), f"{what}: {actual!r}"
    assert abs(actual - expected) <= tol, f"{what}: {actual!r} != {expected!r}"


def ece(conf: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    """The binned ECE of samples: sum_b n_b / N * |mean confidence_b - accuracy_b|."""
    conf = np.asarray(conf, dtype=np.float64)
    return float(ece_from_bins(*per_bin(conf, np.asarray(correct, dtype=np.float64), bins))[0])
