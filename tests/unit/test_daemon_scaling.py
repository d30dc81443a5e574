"""The daemon in-process on what scaling out assumes: a checkpoint of the previous
format (no shape recorded) restores as ``{index: 0, count: 1}``; topics that stop
co-partitioning make ``/readyz`` fail with the reason, at start they are a config
error. Milliseconds, no broker."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from calmon.config import Config, Instance
from calmon.daemon import Daemon
from calmon.engine.engine import Engine
from calmon.errors import ConfigError, StateError
from calmon.io.exposition import new_registry
from calmon.io.source import CoPartitionError, Position
from tests.daemon_helpers import http_get
from tests.fakes import ListSource, partitions_of
from tests.unit.io.checkpoint_fixture import FIXTURE, batches
from tests.unit.io.checkpoint_fixture import config as fixture_config
from tests.unit.test_daemon_inprocess import Running, daemon_over, traffic

PROBLEM = "kafka.instance.count: 2 instances need both input topics co-partitioned, ..."


def with_state(cfg: Config, tmp_path: Path, instance: Instance | None) -> Config:
    return dataclasses.replace(
        cfg, state=dataclasses.replace(cfg.state, dir=str(tmp_path / "state")),
        kafka=dataclasses.replace(cfg.kafka, instance=instance),
        server=dataclasses.replace(cfg.server, host="127.0.0.1", port=0))


def test_a_previous_format_checkpoint_restores_as_one_instance(tmp_path: Path) -> None:
    """The format-1 fixture (written before the shape was recorded)."""
    (tmp_path / "state").mkdir()
    shutil.copyfile(FIXTURE, tmp_path / "state" / "ckpt-000000000001.calmon")
    two = Daemon(with_state(fixture_config(), tmp_path, Instance(index=0, count=2)),
                 registry=new_registry(), source=ListSource({}),
                 install_signals=False)
    with pytest.raises(StateError, match=r"written by instance \{index: 0, count: 1\}"):
        two.run()

    one = Daemon(with_state(fixture_config(), tmp_path, None),
                 registry=new_registry(), source=ListSource({}),
                 install_signals=False)
    one._restore()
    reference = Engine(fixture_config())
    for raws in batches(0):
        reference.feed(raws)
    assert one.restored and one.engine.status()["counters"] == reference.status()["counters"]


class Splitting(ListSource):
    """A ListSource whose topics may stop co-partitioning, or refuse an assignment."""

    def __init__(self, partitions: dict[Position, list[bytes | None]]) -> None:
        super().__init__(partitions)
        self.why: str | None = None
        self.refuse = False

    def assign(self, positions: dict[Position, int] | None = None, *,
               from_checkpoint: bool = False) -> list[Position]:
        if self.refuse:
            self.assigns += 1
            raise CoPartitionError(PROBLEM)
        return super().assign(positions, from_checkpoint=from_checkpoint)

    def problem(self) -> str | None:
        return self.why


def test_topics_that_stop_co_partitioning_fail_readiness_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("calmon.daemon.REFUSED_RETRY_S", 0.05)
    preds, labels = traffic(10)
    source = Splitting(partitions_of(preds, labels))
    d = daemon_over(tmp_path, source)
    with Running(d) as run:
        run.wait(d.ready, "ready")
        source.why = PROBLEM  # found at a metadata refresh
        assert not d.ready() and d.unready_reason() == PROBLEM
        assert d.http is not None
        code, body = http_get(d.http.port, "/readyz")
        assert code == 503 and PROBLEM in body.decode()
        source.why = None
        assert d.ready()
        # a re-assignment refused later: unready with the reason, never an exit
        source.refuse = True
        d.assigned = False
        run.wait(lambda: d.unready_reason() == PROBLEM, "the refusal")
        source.refuse = False
        run.wait(d.ready, "ready again")


def test_topics_that_cannot_co_partition_at_start_are_a_config_error(tmp_path: Path) -> None:
    source = Splitting({})
    source.refuse = True
    with pytest.raises(ConfigError) as e:
        daemon_over(tmp_path, source).run()
    assert e.value.problems == [PROBLEM]
