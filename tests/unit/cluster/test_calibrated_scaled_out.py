"""Scaled out, the owner's calibrated ECE, sample count and /reliability diagrams
(contract §6 "honest calibrated ECE", §7): computed on every sender's samples predicted
after the live calibrator's ``fitted_at``, never on its fit data, nor on one instance's
share. In memory: three real engines and senders (one the daemon's own), the daemon's
real Cluster owner and Policy on a calibrators directory under tmp_path; no broker
(joined batches go straight into ``Owner.accept``).

Every expected number comes from numpy/scipy on the records the test made.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from calmon import config as config_mod
from calmon.daemon import Daemon
from calmon.engine.engine import Engine
from calmon.io.exposition import new_registry
from calmon.recal.registry import Registry
from tests import oracle
from tests.fakes import ListSource
from tests.recal_helpers import BASE_TS, feed_pairs, window_mask

HOUR = 3600.0
SENDERS = 3
T = 2.0  # the live calibrator's temperature: sigmoid(z / T)
FITTED = BASE_TS + 2 * HOUR  # its fitted_at
WINDOWS = {"1h": HOUR, "3h": 3 * HOUR, "24h": 24 * HOUR}  # 3h reaches before FITTED


def records(rng: np.random.Generator, model: str, sender: int, n: int,
            truth: str) -> list[tuple[dict, dict]]:
    """Predictions over four hours. ``truth`` "shift": labels follow sigmoid(2.5 z)
    until FITTED and sigmoid(z / T) after it (the calibrator fits only the later regime,
    and is far off on the earlier one); "raw": sigmoid(z) throughout."""
    ts = np.round(BASE_TS + np.sort(rng.uniform(0.0, 4 * HOUR, n)), 3)
    z = rng.normal(0.0, 1.5, n)
    if truth == "shift":
        p = expit(np.where(ts > FITTED, z / T, 2.5 * z))
    else:
        p = expit(z)
    y = (rng.random(n) < p).astype(int)
    return [({"id": f"{model}-{sender}-{i}", "model": model, "ts": float(ts[i]),
              "logit": float(z[i])}, {"id": f"{model}-{sender}-{i}", "label": int(y[i])})
            for i in range(n)]


def arrays(pairs: list[tuple[dict, dict]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([p["ts"] for p, _ in pairs]), np.array([p["logit"] for p, _ in pairs]),
            np.array([lab["label"] for _, lab in pairs]))


def temperature_doc(model: str) -> dict:
    return {"model": model, "segment": "__all__", "method": "temperature",
            "params": {"temperature": T}, "input": "logit",
            "fitted_at": datetime.fromtimestamp(FITTED, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def test_the_owner_reports_calibrated_ece_and_diagrams_of_all_senders_after_the_fit(
        tmp_path: Path) -> None:
    out = tmp_path / "cal"
    cfg = config_mod.from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "joined_topic": "j",
                  "calibrators_topic": "c", "instance": {"index": 0, "count": SENDERS}},
        "metrics": {"bins": 15, "windows": list(WINDOWS)},
        "segments": {"slices": []},
        # no refit may replace the calibrator under test
        "recalibration": {"output_dir": str(out), "min_samples": 10**7, "buffer": 50_000},
        "state": {"dir": str(tmp_path / "state")},
        "server": {"host": "127.0.0.1", "port": 0}})
    d = Daemon(cfg, registry=new_registry(), source=ListSource({}),
               install_signals=False)
    cluster = d.cluster
    assert cluster is not None and d.recal is None
    # live calibrators of "ctr" and "other" (the daemon's registry reads this directory)
    Registry(out).publish(temperature_doc("ctr"))
    Registry(out).publish(temperature_doc("other"))

    rng = np.random.default_rng(7)
    data = {(m, i): records(rng, m, i, n, truth)
            for i in range(SENDERS)
            for m, n, truth in (("ctr", 900, "shift"), ("plain", 300, "raw"),
                                ("other", 300, "shift"))}
    # instance 0 is the daemon itself; instances 1 and 2 are engines of their own
    engines = [d.engine] + [Engine(cfg) for _ in range(1, SENDERS)]
    senders = [cluster.sender] + [type(cluster.sender)(i) for i in range(1, SENDERS)]
    # "other" hashes to joined-topic partition 1, which another instance owns
    partition = {b"ctr": 0, b"plain": 0, b"other": 1}
    offset = 0
    for i in range(SENDERS):
        pairs = [pr for m in ("ctr", "plain", "other") for pr in data[(m, i)]]
        feed_pairs(engines[i], pairs, i)
        senders[i].collect(engines[i], {("predictions", i): len(pairs),
                                        ("labels", i): len(pairs)})
        assert {k for k, _ in senders[i].pending} == set(partition)
        for key, value in senders[i].pending:
            assert cluster.owner.accept(partition[key], offset, value)
            offset += 1
        senders[i].flush(lambda batches: True)
    cluster.owned = frozenset({0})
    cluster._check()

    state = cluster.metrics_state()
    got_ece = {(m, s, w): v for m, s, w, v in state.calibrated_ece}
    got_n = {(m, s, w): n for m, s, w, n in state.calibrated_samples}
    # only the owner exports a model's calibrated ECE; "other" is another instance's
    assert {m for m, _, _ in got_n} == {"ctr", "plain"}
    assert cluster.calibrated_bins("other", "__all__", "24h") is None

    for model in ("ctr", "plain"):
        ts, z, y = (np.concatenate(a) for a in zip(*(arrays(data[(model, i)])
                                                       for i in range(SENDERS)), strict=True))
        now = float(ts.max())  # the owner's clock: the largest ts any sender reported
        for w, seconds in WINDOWS.items():
            inside = window_mask(ts, now, seconds)
            if model == "ctr":  # after the calibrator, predicted after fitted_at only
                mask = inside & (ts > FITTED)
                probs = np.clip(expit(z[mask] / T), 1e-7, 1 - 1e-7)
            else:  # no calibrator: the identity on every sender's window samples
                mask = inside
                probs = expit(z[mask])
            count, csum, ksum = oracle.per_bin(probs, y[mask].astype(float), 15)
            want, _ = oracle.ece_from_bins(count, csum, ksum)
            key = (model, "__all__", w)
            assert got_n[key] == mask.sum() > 0
            assert got_ece[key] == pytest.approx(want, abs=1e-9), key
            # more than any one instance holds
            assert mask.sum() > max(window_mask(arrays(data[(model, i)])[0], now, seconds)
                                    .sum() for i in range(SENDERS))
            bins = cluster.calibrated_bins(model, "__all__", w)
            if model == "plain":
                assert bins is None  # no calibrator: no calibrated diagram (as one instance)
                continue
            assert bins is not None
            np.testing.assert_allclose(bins.count, count, atol=1e-9)
            np.testing.assert_allclose(bins.conf, csum, atol=1e-9)
            np.testing.assert_allclose(bins.correct, ksum, atol=1e-9)
            if w != "1h":  # the fit-regime samples would have shown a far larger ECE
                pre = inside & (ts <= FITTED)
                assert pre.sum() > 500
                dishonest = oracle.ece(np.clip(expit(z[inside] / T), 1e-7, 1 - 1e-7),
                                       y[inside].astype(float), 15)
                assert dishonest > want + 0.03, (dishonest, want)

    # /reliability on the daemon: the calibrated diagram of the owned model, drawn from
    # the owner's bins (instance 0's own raw diagram beside it holds a third of them)
    d.refresher.update(full=True)
    status, _ctype, body = d.pages["/reliability"]({"window": ["3h"], "model": ["ctr"]})
    assert status == 200
    page = body.decode()
    cal_svg = page[page.index('class="diagram calibrated"'):]
    cal_svg = cal_svg[:cal_svg.index("</svg>")]
    shown = {int(b): float(n) for b, n in
             re.findall(r'class="bar" data-bin="(\d+)" data-count="(\d+)"', cal_svg)}
    ts, z, y = (np.concatenate(a) for a in zip(*(arrays(data[("ctr", i)])
                                                   for i in range(SENDERS)), strict=True))
    mask = window_mask(ts, float(ts.max()), 3 * HOUR) & (ts > FITTED)
    count, _, _ = oracle.per_bin(np.clip(expit(z[mask] / T), 1e-7, 1 - 1e-7),
                                 y[mask].astype(float), 15)
    assert shown == {b: float(c) for b, c in enumerate(count) if c > 0}
    assert "all instances&#x27; buffered samples, on the owner" in page
    # a model without a calibrator gets no calibrated diagram
    _, _, body = d.pages["/reliability"]({"window": ["3h"], "model": ["plain"]})
    assert 'class="diagram raw"' in body.decode()
    assert 'class="diagram calibrated"' not in body.decode()
