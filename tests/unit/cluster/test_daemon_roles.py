"""Which recalibration a daemon runs (contract §7): one instance (or none) keeps the
in-process loop and opens no internal topic; scaled out with joined_topic, the cluster
layer replaces it, and the checkpoint carries its section."""

from __future__ import annotations

import json
from pathlib import Path

from calmon import config as config_mod
from calmon.cluster.batch import decode
from calmon.daemon import Daemon
from calmon.engine.records import Kind, Raw
from calmon.io.checkpoint import CheckpointStore
from calmon.io.exposition import new_registry
from tests.fakes import ListSource


def daemon(tmp_path: Path, kafka: dict) -> Daemon:
    cfg = config_mod.from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", **kafka},
        "recalibration": {"output_dir": str(tmp_path / "cal")},
        "state": {"dir": str(tmp_path / "state")},
        "server": {"host": "127.0.0.1", "port": 0}})
    return Daemon(cfg, registry=new_registry(),
                  source=ListSource({}), install_signals=False)


def test_one_instance_keeps_the_in_process_loop(tmp_path: Path) -> None:
    for kafka in ({}, {"instance": {"index": 0, "count": 1}, "joined_topic": "j"}):
        d = daemon(tmp_path, kafka)
        assert d.recal is not None and d.cluster is None
        assert "recalibration_owner" not in d.status()


def test_scaled_out_the_checkpoint_holds_the_joined_batches_until_acknowledged(
        tmp_path: Path) -> None:
    d = daemon(tmp_path, {"instance": {"index": 1, "count": 2}, "joined_topic": "j",
                          "calibrators_topic": "c"})
    assert d.recal is None and d.cluster is not None
    sent: list[list[tuple[bytes, bytes]]] = []
    d.cluster.producer.send = lambda batches: False  # type: ignore[method-assign]
    raws = []
    for i in range(5):
        raws.append(Raw(Kind.PREDICTION, json.dumps(
            {"id": str(i), "model": "ctr", "ts": 1000.0 + i, "prob": 0.2}).encode(),
            None, f"predictions/1/{i}"))
        raws.append(Raw(Kind.LABEL, json.dumps({"id": str(i), "label": i % 2}).encode(),
                        None, f"labels/1/{i}"))
    d.engine.feed(raws)
    d.positions = {("predictions", 1): 5, ("labels", 1): 5}
    d.checkpoint()  # the broker does not answer: the batch stays pending, in the file
    ckpt = CheckpointStore(tmp_path / "state").load("fail")
    assert ckpt is not None
    pending = ckpt.state["cluster"]["sender"]["pending"]
    assert len(pending) == 1 and bytes(pending[0][0]) == b"ctr"
    b = decode(bytes(pending[0][1]))
    assert (b.model, b.now, b.sender, len(b)) == ("ctr", 1004.0, 1, 5)
    assert b.source == {("predictions", 1): (0, 5), ("labels", 1): (0, 5)}
    d.cluster.producer.send = lambda batches: sent.append(batches) or True  # type: ignore[method-assign]
    d.checkpoint()  # acknowledged now: sent once, forgotten
    assert len(sent) == 1 and sent[0][0][1] == bytes(pending[0][1])
    assert d.cluster.sender.pending == []


def test_status_counts_completed_checks_in_both_roles(tmp_path: Path) -> None:
    """/status says how many recalibration checks completed: the in-process loop's under
    ``recalibration`` (with the refits it held, v4), the owner's under
    ``recalibration_owner`` (tests wait on them)."""
    one = daemon(tmp_path / "one", {})
    assert one.recal is not None
    assert one.status()["recalibration"] == {"checks": 0, "held": 0}
    assert one.recal.run_once() == []  # no event time yet: nothing was checked
    assert one.status()["recalibration"] == {"checks": 0, "held": 0}
    one.engine.feed([
        Raw(Kind.PREDICTION, json.dumps({"id": "1", "model": "ctr", "ts": 1000.0,
                                         "prob": 0.2}).encode(), None, "predictions/0/0"),
        Raw(Kind.LABEL, json.dumps({"id": "1", "label": 0}).encode(), None, "labels/0/0")])
    one.recal.run_once()
    one.recal.run_once()
    assert one.status()["recalibration"] == {"checks": 2, "held": 0}

    out = daemon(tmp_path / "out", {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
                                    "calibrators_topic": "c"})
    assert out.cluster is not None and "recalibration" not in out.status()
    assert out.status()["recalibration_owner"]["checks"] == 0
    out.cluster._check()  # the owner thread's step (it owns nothing here)
    assert out.status()["recalibration_owner"]["checks"] == 1
