"""Synthetic traffic for ``calmon demo``: three models whose calibration drifts.

* ``ctr``: a binary click model (logits) with implicit negatives — only clicks
  get a label; it turns over-confident (logits x 2.5) after ``drift_at``.
* ``triage``: a 5-class classifier (probabilities) that turns under-confident
  (logits x 0.4) a little later.
* ``fraud``: a binary model (probabilities) with country and device segments,
  where the base rate in ``country=BR`` shifts up (a prior shift) mid-run.
* ``search``: a binary model (logits) that stays calibrated throughout: it must
  never raise a drift alarm.

Labels follow their predictions after a random delay, sometimes out of order,
keyed by id like a real pipeline.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from calmon.calibrators import scores

log = logging.getLogger(__name__)


def sigmoid(z: float) -> float:
    return float(scores.sigmoid(np.asarray(z, dtype=np.float64)))

MODELS = ("ctr", "fraud", "triage", "search")
COUNTRIES = ("US", "DE", "BR", "IN", "JP")
DEVICES = ("ios", "android", "web")


@dataclass
class Drift:
    ctr_at: float = 10.0  # seconds after start
    triage_at: float = 20.0
    fraud_at: float = 15.0


class Traffic:
    def __init__(self, bootstrap: str, predictions_topic: str, labels_topic: str, rate: float,
                 seed: int = 7, drift: Drift | None = None) -> None:
        self.bootstrap = bootstrap
        self.predictions_topic = predictions_topic
        self.labels_topic = labels_topic
        self.rate = rate
        self.rng = np.random.default_rng(seed)
        self.drift = drift or Drift()
        self.sent = 0
        self.labels_sent = 0
        self._seq = 0
        self._due: list[tuple[float, int, bytes, bytes]] = []  # (send at, seq, key, label)

    def _prediction(self, model: str, elapsed: float,
                    now: float) -> tuple[dict[str, object], int | None]:
        """One prediction record and its true label (None: no label will be sent)."""
        rng = self.rng
        self._seq += 1
        pid = f"{model}-{self._seq}"
        country = COUNTRIES[int(rng.integers(len(COUNTRIES)))]
        device = DEVICES[int(rng.integers(len(DEVICES)))]
        seg = {"country": country, "device": device}
        if model == "ctr":
            z = float(rng.normal(-2.5, 1.2))
            y = int(rng.random() < sigmoid(z))
            scale = 2.5 if elapsed >= self.drift.ctr_at else 1.0
            rec = {"id": pid, "model": model, "ts": now, "segment": seg, "logit": z * scale}
            return rec, (1 if y else None)  # implicit negatives: only clicks are labelled
        if model == "fraud":
            z = float(rng.normal(-1.5, 1.5))
            shift = 1.5 if (country == "BR" and elapsed >= self.drift.fraud_at) else 0.0
            y = int(rng.random() < sigmoid(z + shift))
            rec = {"id": pid, "model": model, "ts": now, "segment": seg, "prob": sigmoid(z)}
            return rec, (1 if y else None)
        if model == "search":  # calibrated for ever: labels drawn from its own scores
            z = float(rng.normal(-1.0, 1.5))
            y = int(rng.random() < sigmoid(z))
            return ({"id": pid, "model": model, "ts": now, "segment": seg, "logit": z},
                    (1 if y else None))
        zs = rng.normal(0.0, 1.6, 5)
        p = scores.softmax(zs[None, :])[0]
        y = int(rng.choice(5, p=p))
        scale = 0.4 if elapsed >= self.drift.triage_at else 1.0
        q = scores.softmax(zs[None, :] * scale)[0]
        return {"id": pid, "model": "triage", "ts": now, "segment": seg,
                "probs": [round(float(v), 9) for v in q]}, y

    def _tick(self, elapsed: float, now: float, tick: float,
              carry: float) -> tuple[list[tuple[dict[str, object], float | None]], float]:
        """The predictions of one tick (each with its label's send time, or None) and the
        fractional rate carried to the next: one schedule for the live run and replay."""
        carry += self.rate * tick
        n, carry = int(carry), carry - int(carry)
        out: list[tuple[dict[str, object], float | None]] = []
        for _ in range(n):
            model = MODELS[int(self.rng.integers(len(MODELS)))]
            rec, y = self._prediction(model, elapsed, now)
            due = None
            if y is not None:
                due = now + float(self.rng.exponential(1.0))
                rec["_label"] = y
            out.append((rec, due))
        return out, carry

    def timeline(self, duration: float, start: float, tick: float = 0.1,
                 ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        """The predictions and labels ``run`` would send over ``duration`` seconds from
        ``start``, in event time and without a broker: what the demo's own timeline
        test replays (tests/statistics/test_demo_timeline.py)."""
        preds: list[dict[str, object]] = []
        labels: list[dict[str, object]] = []
        carry, now = 0.0, start
        while now - start < duration:
            sent, carry = self._tick(now - start, now, tick, carry)
            for rec, due in sent:
                y = rec.pop("_label", None)
                preds.append(rec)
                if due is not None:
                    labels.append({"id": rec["id"], "label": y, "ts": due})
            now += tick
        return preds, labels

    def run(self, stop: threading.Event) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20)
        start = time.time()
        tick = 0.1
        carry = 0.0
        try:
            while not stop.is_set():
                now = time.time()
                sent, carry = self._tick(now - start, now, tick, carry)
                for rec, due in sent:
                    y = rec.pop("_label", None)
                    key = str(rec["id"]).encode()
                    producer.send(self.predictions_topic, key=key, value=json.dumps(rec).encode())
                    self.sent += 1
                    if due is not None:
                        label = json.dumps({"id": rec["id"], "label": y, "ts": due})
                        heapq.heappush(self._due, (due, self._seq, key, label.encode()))
                while self._due and self._due[0][0] <= now:
                    _, _, key, value = heapq.heappop(self._due)
                    producer.send(self.labels_topic, key=key, value=value)
                    self.labels_sent += 1
                stop.wait(tick)  # the traffic's own pace, not synchronisation
        finally:
            producer.close(timeout=2)
