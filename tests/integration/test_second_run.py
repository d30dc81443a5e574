"""Issue 36 point 1, the newcomer's second run, end to end: a new config and state dir on
topics an earlier run read with the same ``kafka.group_id``. It starts where that run
stopped (the group's committed offsets) and so reads nothing; it used to say only
"starting from empty state", show 0 records and stay ready. It now says where it starts
and why it reads none of the records, in its log and in ``/status``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    end_positions,
    interleave,
    load_config,
    make_dataset,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

N = 60


def test_a_second_run_on_a_read_group_says_it_starts_at_the_end(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    first = write_config(tmp_path / "first.yaml", kafka_bootstrap, preds_topic, labels_topic)
    preds, labels = make_dataset(N, seed=36)
    with Producer(kafka_bootstrap) as producer:
        ends = end_positions(producer.send(interleave(preds, labels, preds_topic,
                                                      labels_topic, seed=37)))
    with CalmonDaemon(first) as daemon:  # the first run reads everything and commits
        daemon.wait_positions(ends)
        daemon.wait_checkpoint_of(ends, "a checkpoint (and commit) of every record")
    # the newcomer's second try: a new config file and state dir, the same group
    cfg = load_config(first)
    cfg["state"]["dir"] = str(tmp_path / "second-state")
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    with CalmonDaemon(second) as daemon:
        st = wait_until(lambda: (s := daemon.status())["start"] and s, 60,
                        "/status start", detail=daemon.log_tail)
        group = cfg["kafka"]["group_id"]
        assert set(st["start"]) == set(ends), st["start"]
        for tp, start in st["start"].items():
            held = ends[tp]  # a fresh topic: offsets from 0
            assert start == {"offset": held, "source": "group", "ahead": 0, "held": held}, tp
        assert st["counters"]["predictions"] == 0
        said = daemon.log.read_text(errors="replace")
        for role, topic in (("predictions", preds_topic), ("labels", labels_topic)):
            assert f"start of the {role} topic: {topic}/0: offset {ends[f'{topic}/0']} " \
                   f"(committed by group {group!r}), 0 of {ends[f'{topic}/0']} records " \
                   "ahead" in said, said
            assert (f"the {role} topic {topic!r} holds {N} records and this run reads none "
                    f"of them: group {group!r} committed the end") in said, said
        assert "a new kafka.group_id with auto_offset_reset earliest" in said
