"""A pause in the labels keeps the estimation map (issue 39, contract v5 §2).

The binary stream of ``test_estimation_map`` (reported logit N(mu, 1.5), the true
logit 1.3x the reported one: raw ECE about 0.04, below every trigger): 50,000 labelled
samples over a day, then labels stop for 3 days while predictions go on, 5,000 a day
(mu a random walk of +-0.2 logits a day), each day in a segment of its own
(``period=k``). Windows 1h, 24h and 7d, join.ttl 7d: nothing expires and the labelled
samples stay in the largest window. After every day of the pause:

- the model's map is the one fitted before the pause: ``estimate_fit_samples`` and
  ``estimate_fit_newest_ts`` unchanged in every window, basis ``series`` (its samples
  are still in the largest window the map is fitted on);
- each day's segment, with no labels of its own, says it reads the model's map (basis
  ``model``, the same fit);
- every estimate is within 4 sqrt(a (1 - a) / n_fit) + 0.002 of the expected accuracy
  (the mean true probability of the decided class), the positive rate the same: the
  whole pause in the model's 7d window, each day in its segment.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from tests.oracle import T0, label_bytes, pred_bytes
from tests.statistics.test_estimation_map import HOUR, N_FIT, by_segment, cfg, feed

DAY = 24 * HOUR
PAUSE_DAYS, PER_DAY = 3, 5_000
WINDOWS = ("1h", "24h", "7d")


def within(est: float | None, want: float, acc: float) -> bool:
    """The tolerance of the expected accuracy ``acc`` (for the positive rate too)."""
    tol = 4 * np.sqrt(acc * (1 - acc) / N_FIT) + 0.002
    return est is not None and abs(est - want) <= tol


def test_three_days_without_labels_keep_the_map_and_the_estimates() -> None:
    rng = np.random.default_rng(3939)
    engine = Engine(cfg(metrics={"windows": list(WINDOWS)}))
    z = rng.normal(0.0, 1.5, N_FIT)
    y = rng.random(N_FIT) < expit(1.3 * z)
    ts = T0 + np.sort(rng.uniform(0, DAY, N_FIT))
    raws: list[Raw] = []
    for i in range(N_FIT):
        raws.append(Raw(Kind.PREDICTION, pred_bytes(f"f{i}", float(ts[i]), logit=float(z[i]))))
        raws.append(Raw(Kind.LABEL, label_bytes(f"f{i}", int(y[i]), float(ts[i]) + 60)))
    feed(engine, raws)
    before = by_segment(engine)[("m", "__all__")]
    assert before.estimate_basis == "series" and before.estimate_fit_samples == N_FIT
    fit_newest = before.estimate_fit_newest_ts
    assert fit_newest is not None and float(ts.max()) <= fit_newest
    mu, all_z = 0.0, []
    for k in range(PAUSE_DAYS):
        mu += rng.choice([-0.2, 0.2])
        zk = rng.normal(mu, 1.5, PER_DAY)
        tk = np.sort(T0 + DAY + k * DAY + rng.uniform(0, DAY, PER_DAY))
        feed(engine, [Raw(Kind.PREDICTION, pred_bytes(f"p{k}-{i}", float(tk[i]),
                                                   logit=float(zk[i]),
                                                   segment={"period": str(k)}))
                      for i in range(PER_DAY)])
        all_z.append(zk)
        for window in WINDOWS:
            est = by_segment(engine, window)
            whole = est[("m", "__all__")]
            assert whole.estimate_basis == "series", (k, window)
            assert (whole.estimate_fit_samples, whole.estimate_fit_newest_ts) == (
                N_FIT, fit_newest), (k, window)
        day = by_segment(engine, "7d")[("m", f"period={k}")]
        assert day.estimate_basis == "model" and day.pending_samples == PER_DAY
        assert (day.estimate_fit_samples, day.estimate_fit_newest_ts) == (N_FIT, fit_newest)
        q = expit(1.3 * zk)
        acc = float(np.where(zk >= 0, q, 1 - q).mean())
        print(f"pause day {k}: expected accuracy {acc:.4f}, estimated "
              f"{day.estimated_accuracy:.4f}; positive rate {q.mean():.4f} vs "
              f"{day.estimated_positive_rate:.4f}")
        assert within(day.estimated_accuracy, acc, acc)
        assert within(day.estimated_positive_rate, float(q.mean()), acc)
    whole = by_segment(engine, "7d")[("m", "__all__")]
    zs = np.concatenate(all_z)
    q = expit(1.3 * zs)
    assert whole.pending_samples == PAUSE_DAYS * PER_DAY
    acc = float(np.where(zs >= 0, q, 1 - q).mean())
    print(f"whole pause: expected accuracy {acc:.4f}, estimated {whole.estimated_accuracy:.4f}")
    assert within(whole.estimated_accuracy, acc, acc)
    assert within(whole.estimated_positive_rate, float(q.mean()), acc)
