"""``calmon replay --json`` with the model's own decisions and class names (contract
v5 §1, §2): accuracy of the decisions equals numpy's, labels given as names join as
their index, and an unlisted name and a bad decision are counted while the valid
records around them join exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from calmon.cli import main
from tests.oracle import T0

CLASSES = ["cash", "card", "prepaid_card"]
CONFIG = """
metrics:
  windows: [1h, 24h]
recalibration:
  window: 24h
fields:
  decision: action
models:
  "*": {threshold: 0.1}
  pay: {classes: [cash, card, prepaid_card]}
"""


def test_replay_scores_decisions_and_names(capsys, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    n = 400
    p = rng.uniform(0, 1, n)
    y = (rng.random(n) < p).astype(int)
    d = np.where(rng.random(n) < 0.5, rng.random(n) < 0.5, -1).astype(int)  # half given
    probs = rng.dirichlet([1.0, 1.0, 1.0], n)
    k = np.array([rng.choice(3, p=r) for r in probs])
    kd = np.where(rng.random(n) < 0.5, rng.integers(0, 3, n), -1)
    preds, labels = [], []
    for i in range(n):
        fraud = {"id": f"f{i}", "model": "fraud", "ts": T0 + i, "prob": float(p[i])}
        if d[i] >= 0:
            fraud["action"] = bool(d[i])
        pay = {"id": f"p{i}", "model": "pay", "ts": T0 + i, "probs": probs[i].tolist()}
        if kd[i] >= 0:
            pay["action"] = CLASSES[kd[i]] if i % 2 else int(kd[i])
        preds += [json.dumps(fraud), json.dumps(pay)]
        labels += [json.dumps({"id": f"f{i}", "label": int(y[i]), "ts": T0 + i + 5}),
                   json.dumps({"id": f"p{i}", "label": CLASSES[k[i]], "ts": T0 + i + 5})]
    preds += [json.dumps({"id": "b1", "model": "pay", "ts": T0 + 9, "probs": [0.5, 0.5, 0.0],
                          "action": "bitcoin"}),
              json.dumps({"id": "b2", "model": "fraud", "ts": T0 + 9, "prob": 0.5,
                          "action": 2})]
    labels += [json.dumps({"id": "p7", "label": "bitcoin", "ts": T0 + 6}),  # before p7's own
               json.dumps({"id": "f8", "label": "card", "ts": T0 + 6})]  # fraud lists none
    (tmp_path / "p.jsonl").write_text("\n".join(preds) + "\n")
    (tmp_path / "l.jsonl").write_text("\n".join(labels) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG)
    rc = main(["replay", "--predictions", str(tmp_path / "p.jsonl"), "--labels",
               str(tmp_path / "l.jsonl"), "-c", str(tmp_path / "c.yaml"), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["invalid_reasons"] == {"predictions": {"bad_decision": 2},
                                      "labels": {"label_out_of_range": 2}}
    assert doc["counters"]["joined"] == 2 * n
    rows = {(r["model"], r["window"]): r for r in doc["rows"] if r["segment"] == "__all__"}
    fraud = rows[("fraud", "24h")]
    assert fraud["samples"] == n
    assert abs(fraud["accuracy"] - np.mean(np.where(d >= 0, d, p >= 0.1) == y)) < 1e-9
    pay = rows[("pay", "24h")]
    assert pay["samples"] == n
    assert abs(pay["accuracy"] - np.mean(np.where(kd >= 0, kd, probs.argmax(1)) == k)) < 1e-9
    brier = np.mean(((probs - np.eye(3)[k]) ** 2).sum(axis=1))
    assert abs(pay["brier"] - brier) < 1e-9
