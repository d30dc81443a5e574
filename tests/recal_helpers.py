"""Small helpers for the recalibration tests: synthetic streams, a real engine fed
with JSON records, and reference numbers computed with plain numpy / scipy only.

Nothing here imports calmon's metrics or calibrators: the expected numbers must
come from an independent computation of the contract's definitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit, log_softmax, softmax

from calmon import config as config_mod
from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from tests import oracle

BASE_TS = 1_764_460_800.0  # 2025-11-30T00:00:00Z
BINS = 15


# ---------------------------------------------------------------- configs


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def recal_config(tmp: Path, **overrides: Any) -> Config:
    """A validated Config for engine-level tests: windows 1h/24h, 15 bins, refits on
    the 1h window, calibrators written under ``tmp``. ``overrides`` merge by section."""
    base: dict[str, Any] = {
        "metrics": {"bins": BINS, "windows": ["1h", "24h"]},
        "segments": {"slices": [], "max_values": 50},
        "join": {"ttl": "7d", "label_ttl": "2d"},
        "recalibration": {
            "enabled": True, "interval": "1s", "cooldown": "1s", "window": "1h",
            "min_samples": 1000, "method": "temperature", "buffer": 50_000,
            "output_dir": str(tmp / "calibrators"),
        },
        "state": {"dir": str(tmp / "state")},
    }
    return config_mod.from_dict(merge(base, overrides))


# ---------------------------------------------------------------- streams


@dataclass
class Stream:
    """Predictions and labels as the user would send them, plus what the test knows."""

    preds: list[dict[str, Any]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Stream) -> Stream:
        self.preds += other.preds
        self.labels += other.labels
        return self

    def __len__(self) -> int:
        return len(self.preds)


def _ts(rng: np.random.Generator, n: int, t0: float, span: float) -> np.ndarray:
    return np.round(t0 + np.sort(rng.uniform(0.0, span, n)), 3)


def binary_logit_stream(rng: np.random.Generator, model: str, n: int, t0: float, span: float,
                        scale: float = 1.0, prefix: str = "") -> Stream:
    """Binary ``logit`` predictions whose true log-odds x are bimodal around +-2.4
    (where a sample tells most about the temperature); the model reports
    ``scale * x`` and labels are drawn from sigmoid(x)."""
    x = rng.choice([-2.4, 2.4], n) + rng.normal(0.0, 0.5, n)
    y = (rng.random(n) < expit(x)).astype(int)
    ts = _ts(rng, n, t0, span)
    s = Stream()
    for i in range(n):
        pid = f"{prefix}{model}-{i}"
        s.preds.append({"id": pid, "model": model, "ts": float(ts[i]),
                        "logit": float(scale * x[i])})
        s.labels.append({"id": pid, "label": int(y[i])})
    return s


def multiclass_logit_stream(rng: np.random.Generator, model: str, n: int, k: int, t0: float,
                            span: float, scale: float = 1.0, prefix: str = "") -> Stream:
    """K-class ``logits`` predictions: true logits ~ N(0, 1.5^2) per class, reported as
    ``scale * x``, labels drawn from softmax(x)."""
    x = rng.normal(0.0, 1.5, (n, k))
    p = softmax(x, axis=1)
    y = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    ts = _ts(rng, n, t0, span)
    s = Stream()
    for i in range(n):
        pid = f"{prefix}{model}-{i}"
        s.preds.append({"id": pid, "model": model, "ts": float(ts[i]),
                        "logits": [float(v) for v in scale * x[i]]})
        s.labels.append({"id": pid, "label": int(y[i])})
    return s


def step_prob_stream(rng: np.random.Generator, model: str, n: int, t0: float, span: float,
                     low: float = 0.2, high: float = 0.8, prefix: str = "") -> Stream:
    """Binary ``prob`` scores s ~ U(0, 1) whose true P(y=1 | s) is a step: ``low`` below
    0.5, ``high`` above. No temperature (nor any sigmoid of a*logit(s)+b) can be flat on
    each side of 0.5, a histogram or isotonic map can."""
    s_ = rng.uniform(0.0, 1.0, n)
    y = (rng.random(n) < np.where(s_ < 0.5, low, high)).astype(int)
    ts = _ts(rng, n, t0, span)
    s = Stream()
    for i in range(n):
        pid = f"{prefix}{model}-{i}"
        s.preds.append({"id": pid, "model": model, "ts": float(ts[i]), "prob": float(s_[i])})
        s.labels.append({"id": pid, "label": int(y[i])})
    return s


# ---------------------------------------------------------------- the engine


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def raws(stream: Stream) -> list[Raw]:
    """Every prediction followed by its label, as the engine gets them from Kafka."""
    out = []
    for i, (p, lab) in enumerate(zip(stream.preds, stream.labels)):
        out.append(Raw(Kind.PREDICTION, dumps(p), None, f"test/p/{i}"))
        out.append(Raw(Kind.LABEL, dumps(lab), None, f"test/l/{i}"))
    return out


def feed_pairs(engine: Engine, pairs: list[tuple[dict[str, Any], dict[str, Any]]], part: int,
               offset: int = 0) -> None:
    """(prediction, label) records fed as if read from partition ``part`` of the
    predictions and labels topics, at offsets from ``offset``."""
    out = []
    for i, (p, lab) in enumerate(pairs, offset):
        out.append(Raw(Kind.PREDICTION, json.dumps(p).encode(), None, f"predictions/{part}/{i}"))
        out.append(Raw(Kind.LABEL, json.dumps(lab).encode(), None, f"labels/{part}/{i}"))
    engine.feed(out)


def feed(engine: Engine, stream: Stream, chunk: int = 5000) -> None:
    records = raws(stream)
    for i in range(0, len(records), chunk):
        rejected = engine.feed(records[i:i + chunk])
        assert not rejected, rejected[:3]


# ---------------------------------------------------------------- reference numbers


def arrays(stream: Stream, model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(ts, scores, labels, kind) of one model's joined samples, in stream order."""
    by_id = {lab["id"]: lab["label"] for lab in stream.labels}
    mine = [p for p in stream.preds if p["model"] == model]
    kind = next(k for k in ("prob", "logit", "probs", "logits") if k in mine[0])
    ts = np.array([p["ts"] for p in mine])
    scores = np.array([p[kind] for p in mine], dtype=np.float64)
    labels = np.array([by_id[p["id"]] for p in mine], dtype=np.int64)
    return ts, scores, labels, kind


def conf_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Binary: P(y=1) vs y; multiclass: top-label confidence vs correctness."""
    if probs.ndim == 1:
        return probs, labels.astype(np.float64)
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def ece_np(probs: np.ndarray, labels: np.ndarray, bins: int = BINS) -> float:
    conf, correct = conf_correct(probs, labels)
    return oracle.ece(conf, correct, bins)


def nll_np(probs: np.ndarray, labels: np.ndarray) -> float:
    py = (np.where(labels == 1, probs, 1.0 - probs) if probs.ndim == 1
          else probs[np.arange(len(labels)), labels])
    return float(np.mean(-np.log(np.clip(py, 1e-15, 1.0))))


def temperature_probs(scores: np.ndarray, kind: str, t: float) -> np.ndarray:
    """sigmoid(z / T) or softmax(z / T), straight from scipy."""
    if kind == "logit":
        return expit(scores / t)
    assert kind == "logits"
    return np.exp(log_softmax(scores / t, axis=1))


def window_mask(ts: np.ndarray, now: float, seconds: float, buckets: int = 16) -> np.ndarray:
    """Membership of the sliding window as documented in calmon/engine/windows.py: a ring
    of ``buckets`` buckets of width W/buckets keyed floor(ts / width); the window holds
    buckets cur - buckets < i <= cur with cur = floor(now / width)."""
    width = seconds / buckets
    return np.floor(ts / width) > np.floor(now / width) - buckets


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def latest(output_dir: Path, model: str, segment: str = "__all__") -> Path:
    return output_dir / model / segment / "latest.json"
