"""Group mode's joined samples (contract §8 with §7): each task's batches carry the
input range of its partition since its last committed checkpoint; a refused
checkpoint's samples ride again with the next one, a restored task sends only what
came after its checkpoint, and the owner counts each sample once."""

from __future__ import annotations

import json
from pathlib import Path

from calmon import config as config_mod
from calmon.cluster import admin
from calmon.cluster.batch import decode
from calmon.cluster.group_sender import GroupSender
from calmon.cluster.owner import Owner
from calmon.daemon import Daemon
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io.exposition import new_registry
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry
from tests.fakes import ListSource

PART = 3


def config(tmp_path: Path) -> config_mod.Config:
    return config_mod.from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "instance": "group",
                  "joined_topic": "j", "calibrators_topic": "c"},
        "recalibration": {"output_dir": str(tmp_path / "cal")},
        "state": {"dir": str(tmp_path / "state")},
        "server": {"host": "127.0.0.1", "port": 0}})


def pairs(first: int, n: int) -> list[Raw]:
    out = []
    for i in range(first, first + n):
        out.append(Raw(Kind.PREDICTION, json.dumps(
            {"id": str(i), "model": "ctr", "ts": 1000.0 + i, "prob": 0.2}).encode(),
            None, f"predictions/{PART}/{i}"))
        out.append(Raw(Kind.LABEL, json.dumps({"id": str(i), "label": i % 2}).encode(),
                       None, f"labels/{PART}/{i}"))
    return out


def at(n: int) -> dict[str, int]:
    return {"predictions": n, "labels": n}


def test_batches_cover_what_the_committed_checkpoints_did_not(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    engine = Engine(cfg)
    sender = GroupSender("j", 1 << 20)
    sender.restored(PART, engine, {})  # a new task
    owner = Owner(Policy(cfg, Registry(tmp_path / "owner")), 1000)

    engine.feed(pairs(0, 5))
    (rec,) = sender.collect({PART: (engine, at(5))})
    topic, key, value, headers = rec
    assert (topic, key, headers) == ("j", b"ctr", [])
    b = decode(value)
    assert (b.model, b.sender, len(b)) == ("ctr", 0, 5)
    assert b.source == {("predictions", PART): (0, 5), ("labels", PART): (0, 5)}
    # the transaction was refused (never committed): the next one carries its samples
    engine.feed(pairs(5, 3))
    (rec,) = sender.collect({PART: (engine, at(8))})
    b = decode(rec[2])
    assert len(b) == 8 and b.source[("labels", PART)] == (0, 8)
    assert owner.accept(0, 0, rec[2])
    sender.committed()
    engine.feed(pairs(8, 2))
    (rec,) = sender.collect({PART: (engine, at(10))})
    assert decode(rec[2]).source[("predictions", PART)] == (8, 10)
    assert owner.accept(0, 1, rec[2])
    sender.committed()
    assert sender.collect({PART: (engine, at(10))}) == []  # nothing new

    # the task moves: its next owner restores the checkpoint and sends what follows
    moved = Engine(cfg)
    moved.restore(engine.snapshot())
    other = GroupSender("j", 1 << 20)
    other.restored(PART, moved, at(10))
    assert other.collect({PART: (moved, at(10))}) == []
    moved.feed(pairs(10, 4))
    (rec,) = other.collect({PART: (moved, at(14))})
    b = decode(rec[2])
    assert len(b) == 4 and b.source[("labels", PART)] == (10, 14)
    assert owner.accept(0, 2, rec[2])
    assert not owner.accept(0, 3, rec[2])  # the same batch read twice: a copy
    assert owner.sample_count("ctr") == 14
    # a task this sender never restored is not sent (what it holds is not known new)
    other.drop(PART)
    moved.feed(pairs(14, 1))
    assert other.collect({PART: (moved, at(15))}) == []


def test_group_mode_runs_the_owner_and_sends_from_the_tasks(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert admin.scaled_out(cfg)  # calibrators list/rollback read and ask the topic
    d = Daemon(cfg, registry=new_registry(), source=ListSource({}), install_signals=False)
    assert d.group is not None and d.recal is None
    assert d.cluster is not None and d.group.tasks.joined is not None
    assert d.cluster.engine is d.group.live  # live calibrators reach every task


def test_live_calibrators_reach_every_task_engine_once(tmp_path: Path) -> None:
    from calmon.group_run import TaskEngines

    cfg = config(tmp_path)
    live = TaskEngines()
    first = Engine(cfg)
    live.set_calibrators({"ctr": "v1"})  # the owner thread keeps the newest only
    assert first.calibrators != {"ctr": "v1"}
    live.push([first])
    assert first.calibrators == {"ctr": "v1"}
    version = first.version
    later = Engine(cfg)  # a task restored since
    live.push([first, later])
    assert later.calibrators == {"ctr": "v1"} and first.version == version
    live.set_changes({("ctr", "__all__"): 5.0})
    live.push([first, later])
    assert first.changes == later.changes == {("ctr", "__all__"): 5.0}
