"""metrics.classwise: the mean over classes of the ECE of p_k against [y = k] (Kull et
al. 2019), per model, segment and window, compared with a plain numpy computation."""

from __future__ import annotations

import json

import numpy as np

from calmon import config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.engine.snapshot import full_snapshot
from tests.oracle import ece


def feed(engine: Engine, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs, ys, raws = [], [], []
    for i in range(n):
        z = rng.normal(0.0, 2.0, k)
        p = np.exp(z) / np.exp(z).sum()
        y = int(rng.choice(k, p=np.exp(z / 2) / np.exp(z / 2).sum()))  # over-confident
        raws.append(Raw(Kind.PREDICTION, json.dumps(
            {"id": f"r{i}", "model": "m", "ts": 1.7e9 + i, "probs": p.tolist()}).encode()))
        raws.append(Raw(Kind.LABEL, json.dumps({"id": f"r{i}", "label": y}).encode()))
        probs.append(p / p.sum())
        ys.append(y)
    assert engine.feed(raws) == []
    return np.array(probs), np.array(ys)


def cfg(classwise: bool) -> config.Config:
    return config.from_dict({"metrics": {"classwise": classwise, "windows": ["24h"]},
                             "recalibration": {"window": "24h"}, "segments": {"slices": []}})


def test_classwise_ece_equals_numpy_and_survives_a_snapshot() -> None:
    engine = Engine(cfg(True))
    probs, ys = feed(engine, 2000, 4, seed=3)
    want = np.mean([ece(probs[:, c], (ys == c).astype(float)) for c in range(4)])
    (row,) = full_snapshot(engine).rows
    assert row.classwise_ece is not None and abs(row.classwise_ece - want) < 1e-9
    assert row.classwise_ece != row.stats.ece  # a different number from top-label ECE

    restored = Engine(cfg(True))
    restored.restore(engine.snapshot())
    (again,) = full_snapshot(restored).rows
    assert again.classwise_ece == row.classwise_ece


def test_classwise_is_off_by_default_and_never_for_binary_models() -> None:
    engine = Engine(cfg(False))
    feed(engine, 200, 3, seed=4)
    assert [r.classwise_ece for r in full_snapshot(engine).rows] == [None]
    binary = Engine(cfg(True))
    assert binary.feed([Raw(Kind.PREDICTION, b'{"id": "a", "model": "b", "ts": 1, "prob": 0.3}'),
                        Raw(Kind.LABEL, b'{"id": "a", "label": 1}')]) == []
    assert [r.classwise_ece for r in full_snapshot(binary).rows] == [None]
