"""Group mode (contract §8): a record the engine raises on (a calmon bug: bad data is
only counted) takes its task back to the committed checkpoint, its partition is read
again one record at a time, and only that record is counted invalid (``internal``)
and dead-lettered; the daemon never dies of it and every other record counts once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from calmon.config import from_dict
from calmon.daemon import Daemon
from calmon.engine import fastparse
from calmon.engine.rawbatch import RawBatch
from calmon.io.exposition import new_registry
from tests.daemon_helpers import Producer, write_config
from tests.fakes import DeadLetterLog
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.oracle import T0, label_bytes, pred_bytes
from tests.unit.test_daemon_inprocess import Running

pytestmark = pytest.mark.integration

N = 60


def _daemon_with_a_bug(path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """A group-mode daemon (in process, dead letters kept in a list) whose batch parser
    raises on any batch holding a record with "boom": a calmon bug only that record
    reaches."""
    d = Daemon(from_dict(yaml.safe_load(path.read_text())), registry=new_registry(),
               install_signals=False)
    d.dead_letters = d.group.dead_letters = DeadLetterLog()  # type: ignore[union-attr,assignment]
    real_parse = fastparse.BatchParser.parse

    def buggy(self: fastparse.BatchParser, raws: RawBatch):  # a bug only "boom" reaches
        if any(v is not None and b'"boom"' in v for v in raws.values):
            raise RuntimeError("a bug")
        return real_parse(self, raws)

    monkeypatch.setattr(fastparse.BatchParser, "parse", buggy)
    return d


def test_an_engine_bug_costs_one_record_in_group_mode(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    path = write_config(tmp_path / "m.yaml", kafka_bootstrap, preds_topic, labels_topic,
                        kafka={"instance": "group", "client": GROUP_CLIENT},
                        state={"checkpoint_interval": "1s"})
    d = _daemon_with_a_bug(path, monkeypatch)
    records = [(preds_topic, f"id{i}".encode(), pred_bytes(f"id{i}", T0 + i, "m", prob=0.3))
               for i in range(N)]
    records += [(labels_topic, f"id{i}".encode(), label_bytes(f"id{i}", i % 2, T0 + i + 1))
                for i in range(N)]
    boom = pred_bytes("boom", T0 + 5, "m", prob=0.5)
    with Running(d) as run:
        run.wait(lambda: d.group is not None and len(d.group.tasks.tasks) == 2, "2 tasks")
        with Producer(kafka_bootstrap) as producer:
            producer.send([*records[:N // 2], (preds_topic, b"boom", boom, 0),
                           *records[N // 2:]])

        def counted() -> bool:
            assert d.group is not None
            engines = d.group.tasks.engines()
            return sum(e.status()["counters"]["joined"] for e in engines) == N and sum(
                e.status()["counters"]["invalid"] for e in engines) == 1
        run.wait(counted, "every record counted once, the culprit invalid")
    sent = d.dead_letters.sent  # type: ignore[attr-defined]
    assert [(v, reason) for v, reason, _ in sent] == [(boom, "internal")]
    assert sent[0][2].startswith(f"{preds_topic}/0/")
    assert d.group is not None and 0 in d.group.tasks.careful


def test_a_roll_back_counts_no_record_twice_in_the_process_totals(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The records a task fed since its checkpoint (none here: no checkpoint is due) are
    read again after the roll-back; the ``_total`` counters (contract §5) count each
    record once, as the task's own counters do."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    path = write_config(tmp_path / "m.yaml", kafka_bootstrap, preds_topic, labels_topic,
                        kafka={"instance": "group", "client": GROUP_CLIENT},
                        state={"checkpoint_interval": "1h"})
    d = _daemon_with_a_bug(path, monkeypatch)
    records = [(preds_topic, f"id{i}".encode(), pred_bytes(f"id{i}", T0 + i, "m", prob=0.3), i % 2)
               for i in range(N)]
    records += [(labels_topic, f"id{i}".encode(), label_bytes(f"id{i}", i % 2, T0 + i + 1), i % 2)
                for i in range(N)]

    def counters(name: str) -> int:
        assert d.group is not None
        return sum(e.status()["counters"][name] for e in d.group.tasks.engines())

    with Running(d) as run:
        run.wait(lambda: d.group is not None and len(d.group.tasks.tasks) == 2, "2 tasks")
        with Producer(kafka_bootstrap) as producer:
            producer.send(records)
        run.wait(lambda: sum(d.totals.copy().joined.values()) == N, "every pair joined")
        with Producer(kafka_bootstrap) as producer:
            producer.send([(preds_topic, b"boom", pred_bytes("boom", T0 + 5, "m", prob=0.5), 0)])
        run.wait(lambda: counters("invalid") == 1 and counters("joined") == N,
                 "partition 0 read again, the culprit invalid")
        totals = d.totals.copy()
    assert d.group is not None and 0 in d.group.tasks.careful
    # N predictions, N labels, N pairs: half of them on the partition read twice
    assert (sum(totals.predictions.values()), sum(totals.labels.values()),
            sum(totals.joined.values())) == (N, N, N)
    assert dict(totals.invalid) == {("predictions", "internal"): 1}
    assert int(totals.bins[("m", "__all__")][0].sum()) == N  # calmon_bin_samples_total
