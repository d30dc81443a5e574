"""/reliability with metrics.classwise (issue 24): a multiclass series names its
worst-calibrated class (largest one-vs-rest ECE, computed here with numpy) and shows that
class's diagram beside the top-label one; without metrics.classwise, nothing changes."""

from __future__ import annotations

import json
import re

import numpy as np

from calmon import config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.engine.snapshot import full_snapshot
from calmon.io import reliability
from tests.oracle import ece

K, SHIFTED = 4, 2


def feed(engine: Engine, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated logits except a prior shift of +2 on class SHIFTED's true logit."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, (n, K))
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    t = np.exp(z + 2.0 * np.eye(K)[SHIFTED])
    truth = t / t.sum(axis=1, keepdims=True)
    ys = np.array([int(rng.choice(K, p=row)) for row in truth])
    raws = []
    for i in range(n):
        raws.append(Raw(Kind.PREDICTION, json.dumps(
            {"id": f"r{i}", "model": "m", "ts": 1.7e9 + i, "probs": probs[i].tolist()}).encode()))
        raws.append(Raw(Kind.LABEL, json.dumps({"id": f"r{i}", "label": int(ys[i])}).encode()))
    assert engine.feed(raws) == []
    return probs, ys


def cfg(classwise: bool) -> config.Config:
    return config.from_dict({"metrics": {"classwise": classwise, "windows": ["24h"]},
                             "recalibration": {"window": "24h", "min_samples": 100},
                             "segments": {"slices": []}})


def test_the_worst_class_is_named_and_drawn_one_vs_rest() -> None:
    engine = Engine(cfg(True))
    probs, ys = feed(engine, 1500, seed=5)
    per_class = [ece(probs[:, c], (ys == c).astype(float)) for c in range(K)]
    worst = int(np.argmax(per_class))
    assert worst == SHIFTED
    (row,) = full_snapshot(engine).rows
    assert row.worst_class is not None and row.worst_class.cls == worst
    assert abs(row.worst_class.ece - per_class[worst]) < 1e-9
    code, _, body = reliability.page(engine.cfg, full_snapshot(engine), None, {})
    assert code == 200
    html = body.decode()
    fig = re.search(r'<figure class=worst data-class="(\d+)">(.*?)</figure>', html, re.S)
    assert fig is not None and int(fig.group(1)) == worst
    assert f"worst-calibrated class {worst}" in fig.group(2)
    assert 'class="diagram classwise"' in fig.group(2)
    # its bars are p_worst's bins (right-closed, 15 equal widths), counted with numpy
    edges = np.arange(16) / 15
    b = np.clip(np.searchsorted(edges, probs[:, worst], side="left") - 1, 0, 14)
    want = {int(i): int(c) for i, c in enumerate(np.bincount(b, minlength=15)) if c}
    got = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r'class="bar" data-bin="(\d+)" data-count="(\d+)"', fig.group(2))}
    assert got == want
    # the top-label diagram is still the first one of the section
    assert html.index('class="diagram raw"') < html.index('class="diagram classwise"')


def test_without_classwise_no_class_is_named() -> None:
    engine = Engine(cfg(False))
    feed(engine, 300, seed=6)
    (row,) = full_snapshot(engine).rows
    assert row.worst_class is None
    _, _, body = reliability.page(engine.cfg, full_snapshot(engine), None, {})
    assert b"worst-calibrated" not in body and b"classwise" not in body
