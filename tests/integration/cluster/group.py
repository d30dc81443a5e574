"""What the group-mode tests share (``kafka.instance: group``, contract §8): members of
one group, the expected counts of a stream computed from its records, and the summed
``calmon_window_samples`` of the live members."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from calmon.config import from_dict
from calmon.io.topic_checks import describe
from tests.daemon_helpers import CalmonDaemon, http_get, scrape, series, write_config
from tests.integration.cluster.fleet import GROUP_CLIENT

WINDOWS = {"windows": ["1h", "24h"]}


def member(tmp_path: Path, bootstrap: str, preds: str, labels: str, group: str,
           name: str) -> CalmonDaemon:
    """A member of ``group`` (not started), with a state dir and config of its own."""
    return CalmonDaemon(write_config(
        tmp_path / f"{name}.yaml", bootstrap, preds, labels,
        kafka={"group_id": group, "instance": "group", "client": GROUP_CLIENT},
        metrics=WINDOWS, state={"checkpoint_interval": "1s"}),
        log=tmp_path / f"{name}.log")


def expected_counts(preds: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """(model, segment) -> joined samples, when every prediction has its label: counted
    from the records (each prediction in __all__ and in one series per slice key)."""
    out: Counter[tuple[str, str]] = Counter()
    for p in preds:
        out[(p["model"], "__all__")] += 1
        for key in ("country", "device"):
            if key in p["segment"]:
                out[(p["model"], f"{key}={p['segment'][key]}")] += 1
    return out


def summed_samples(daemons: list[CalmonDaemon], window: str = "24h"
                   ) -> Counter[tuple[str, str]]:
    """calmon_window_samples{window} summed over the running members."""
    out: Counter[tuple[str, str]] = Counter()
    for d in daemons:
        if not d.running:
            continue
        got = series(scrape(d.port), "calmon_window_samples", "model", "segment", "window")
        for (model, segment, w), v in got.items():
            if w == window and v:
                out[(model, segment)] += int(v)
    return out


def owned(d: CalmonDaemon) -> list[int]:
    """The partitions a member runs tasks for (from /status; none while it does not
    answer yet)."""
    code, body = http_get(d.port, "/status")
    if code != 200:
        return []
    return [t["partition"] for t in json.loads(body)["group"]["tasks"]
            if t["state"] == "running"]


def cleanup_policy(bootstrap: str, topic: str) -> str | None:
    """The topic's cleanup.policy as DescribeConfigs answers it (``describe`` reads the
    config's two input topics: the changelog stands in for one)."""
    cfg = from_dict({"kafka": {"bootstrap_servers": bootstrap, "predictions_topic": topic,
                               "labels_topic": f"{topic}-unused"}}, env={})
    return describe(cfg.kafka, 10.0).get(topic, {}).get("cleanup.policy")


def dump(daemons: list[CalmonDaemon]) -> str:
    out = []
    for d in daemons:
        code, body = http_get(d.port, "/status") if d.running else (0, b"")
        out.append(json.loads(body).get("group") if code == 200 else code)
    return json.dumps(out)[:4000]
