"""Two instances (``kafka.instance: {index: 0|1, count: 2}``) share 4-partition
topics: summed, their cumulative bin counters and ``__all__`` window samples
equal those of one instance reading everything."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    end_positions,
    expected_bins,
    interleave,
    make_dataset,
    series,
    write_config,
)

pytestmark = pytest.mark.integration

N = 1500


def test_two_instances_sum_to_one(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    preds, labels = make_dataset(N, seed=71)
    # keyed by id: a prediction and its label land on the same partition number
    records = interleave(preds, labels, preds_topic, labels_topic, seed=72)
    with Producer(kafka_bootstrap) as producer:
        sent = producer.send(records)
    ends = end_positions(sent)
    assert len(ends) == 8

    configs = [
        write_config(tmp_path / f"instance{i}.yaml", kafka_bootstrap, preds_topic, labels_topic,
                     kafka={"instance": {"index": i, "count": 2}})
        for i in range(2)
    ]
    configs.append(write_config(tmp_path / "single.yaml", kafka_bootstrap, preds_topic,
                                labels_topic))
    daemons = [CalmonDaemon(c) for c in configs]
    scrapes, statuses = [], []
    try:
        for d in daemons:
            d.start(wait_ready=False)
        for i, d in enumerate(daemons):
            d.wait_ready()
            mine = ends if i == 2 else {k: v for k, v in ends.items()
                                        if int(k.rsplit("/", 1)[1]) % 2 == i}
            statuses.append(d.wait_positions(mine))
            scrapes.append(d.scrape())
    finally:
        for d in daemons:
            d.stop()

    # each instance did part of the work, and every prediction found its label
    joined = [st["counters"]["joined"] for st in statuses]
    assert joined[0] > 0 and joined[1] > 0
    assert joined[0] + joined[1] == joined[2] == N
    assert all(st["pending"] == 0 and st["pending_labels"] == 0 for st in statuses)

    def summed(name: str, *labels: str) -> list[Counter[tuple[str, ...]]]:
        return [Counter(series(sc, name, *labels)) for sc in scrapes]

    for name in ("calmon_bin_samples_total", "calmon_bin_correct_total"):
        a, b, single = summed(name, "model", "segment", "bin")
        assert a + b == single, name
    a, b, single = summed("calmon_bin_confidence_total", "model", "segment", "bin")
    assert a.keys() | b.keys() == single.keys()
    for k, v in single.items():
        assert math.isclose(a.get(k, 0) + b.get(k, 0), v, rel_tol=1e-12, abs_tol=1e-9), k

    a, b, single = summed("calmon_window_samples", "model", "segment", "window")
    alls = [Counter({k: v for k, v in c.items() if k[1] == "__all__"}) for c in (a, b, single)]
    assert alls[0] + alls[1] == alls[2]
    assert sum(v for (_, _, w), v in alls[2].items() if w == "7d") == N

    # and the single instance's bins are the ones computed from the records
    want_n, _ = expected_bins(preds, labels)
    assert +single_bins(scrapes[2]) == Counter({k: float(v) for k, v in want_n.items()})


def single_bins(sc: dict) -> Counter[tuple[str, ...]]:
    return Counter(series(sc, "calmon_bin_samples_total", "model", "segment", "bin"))
