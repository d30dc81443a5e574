"""10,000 distinct values of one segment key: the series on /metrics stay bounded
by ``segments.max_values`` (the rest fold into ``__other__``) and no sample is lost."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.daemon_helpers import (
    BASE_TS,
    DEVICES,
    CalmonDaemon,
    Producer,
    dumps,
    end_positions,
    http_get,
    series,
    write_config,
)

pytestmark = pytest.mark.integration

N = 10_000
MAX_VALUES = 20
WINDOWS = ("1h", "24h", "7d")


def test_segment_values_fold_into_other(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       segments={"slices": [["country"], ["device"]],
                                 "max_values": MAX_VALUES})
    rng = np.random.default_rng(61)
    records = []
    devices = Counter()
    for i in range(N):
        device = DEVICES[i % len(DEVICES)]
        devices[device] += 1
        pred = {"id": f"c-{i}", "model": "ctr", "ts": BASE_TS + i * 0.25,
                "segment": {"country": f"country-{i:05d}", "device": device},
                "prob": float(rng.uniform())}
        label = {"id": f"c-{i}", "label": int(rng.random() < pred["prob"]),
                 "ts": pred["ts"] + 1.0}
        records.append((preds_topic, pred["id"].encode(), dumps(pred)))
        records.append((labels_topic, label["id"].encode(), dumps(label)))

    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        sent = producer.send(records, timeout=60)
        daemon.wait_positions(end_positions(sent), timeout=90)
        st = daemon.status()
        code, body = http_get(daemon.port, "/metrics")
        sc = daemon.scrape()
    assert code == 200
    assert st["counters"]["joined"] == N

    samples = series(sc, "calmon_window_samples", "model", "segment", "window")
    for window in WINDOWS:
        segs = {s for (_, s, w) in samples if w == window}
        countries = {s for s in segs if s.startswith("country=")}
        # at most max_values + 1 (__other__) per slice, plus __all__
        assert len(countries) == MAX_VALUES + 1
        assert "country=__other__" in countries
        assert {s for s in segs if s.startswith("device=")} == {f"device={d}" for d in DEVICES}
        assert len(segs) <= 1 + (MAX_VALUES + 1) * 2
    # nothing is lost in the folding: every sample counts in exactly one country series
    total = samples[("ctr", "__all__", "7d")]
    assert total == N
    assert sum(v for (_, s, w), v in samples.items()
               if w == "7d" and s.startswith("country=")) == N
    assert samples[("ctr", "country=__other__", "7d")] == N - MAX_VALUES
    assert {s: samples[("ctr", f"device={s}", "7d")] for s in DEVICES} == {
        d: float(n) for d, n in devices.items()}

    # the cumulative bin counters are bounded the same way
    bins = series(sc, "calmon_bin_samples_total", "model", "segment", "bin")
    assert len({s for (_, s, _) in bins}) == 1 + (MAX_VALUES + 1) + len(DEVICES)
    assert sum(v for (_, s, _), v in bins.items() if s == "__all__") == N
    # and so is the whole exposition
    assert len(body) < 300_000, len(body)
