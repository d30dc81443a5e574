"""Scaled out, a publish goes through the producer of the joined-topic partition its
model is keyed to, as the owner thread itself reads it (issue 32 item 4): the registry
hands the model and segment over (no JSON parsed back), and a partition revoked or
never assigned publishes nothing. No broker: the producer's send is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from calmon import config as config_mod
from calmon.cluster.batch import encode
from calmon.cluster.service import Cluster
from calmon.errors import NotOwnerError
from tests.unit.cluster.test_batch_checks import batch


def doc(model: str) -> dict:
    return {"model": model, "segment": "__all__", "method": "temperature",
            "input": "logit", "params": {"temperature": 1.5, "bias": 0.0}}


def test_a_publish_goes_to_its_models_owned_partition_and_nowhere_else(
        tmp_path: Path) -> None:
    cfg = config_mod.from_dict({
        "kafka": {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
                  "calibrators_topic": "c", "predictions_topic": "preds"},
        "recalibration": {"output_dir": str(tmp_path / "cal")}})
    c = Cluster(cfg)
    sent: list[tuple[int, str, bytes]] = []
    c.publisher.send = lambda p, key, data: sent.append((p, key, data)) or True  # type: ignore[method-assign]
    c.owner.assign({2, 3})
    assert c.owner.accept(2, 0, encode(batch("ctr"))) and c.owner.accept(3, 0, encode(batch("ads")))
    c.owned = frozenset({2})  # partition 3 is assigned, not taken over yet

    out = c.registry.publish(doc("ctr"))
    written = c.registry.dir_of("ctr", "__all__") / "v1.json"
    assert out["version"] == 1 and sent == [(2, "ctr/__all__", written.read_bytes())]
    for model in ("ads", "nobody"):  # not taken over; keyed to no partition here
        with pytest.raises(NotOwnerError):
            c.registry.publish(doc(model))
        assert c.registry.versions(model, "__all__") == []
    c.revoked({2})  # a rebalance takes it back: its producer and its models go
    assert c.owned == frozenset() and 2 not in c.owner.parts
    with pytest.raises(NotOwnerError):
        c.registry.publish(doc("ctr"))
    assert len(sent) == 1 and c.registry.versions("ctr", "__all__") == [1]


def test_a_model_rehashed_to_another_partition_keeps_one_ring_and_clock(
        tmp_path: Path) -> None:
    """Partitions added to the joined topic move a model's key: what the owner held of
    it moves to its new partition (one ring a series, one clock a model), and its
    publishes go through that partition's producer."""
    c = Cluster(config_mod.from_dict({
        "kafka": {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
                  "calibrators_topic": "c", "predictions_topic": "preds"},
        "recalibration": {"output_dir": str(tmp_path / "cal")}}))
    c.owner.assign({1, 2})
    assert c.owner.accept(1, 0, encode(batch("ctr", source={("preds", 0): (0, 4)})))
    assert c.owner.accept(2, 0, encode(batch("ctr", source={("preds", 0): (4, 8)})))
    assert not c.owner.accept(2, 1, encode(batch("ctr", source={("preds", 0): (0, 4)})))
    assert c.owner.sample_count("ctr") == 8 and c.owner.partition_of("ctr") == 2
    assert c.owner.models([1]) == [] and c.owner.series_of([2]) == [("ctr", "__all__")]
    got = c.owner.samples_of("ctr", "__all__")
    assert got is not None and len(got) == 8
