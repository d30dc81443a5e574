"""What the group-mode tests share (``kafka.instance: group``, contract §8): members of
one group, the expected counts of a stream computed from its records, and the summed
``calmon_window_samples`` of the live members."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient

from calmon.config import Config, from_dict
from calmon.engine.engine import Engine
from calmon.io.changelog import TaskWrite
from calmon.io.topic_checks import describe
from calmon.tasklog import TaskLog
from tests import oracle
from tests.daemon_helpers import CalmonDaemon, http_get, scrape, series, write_config
from tests.integration.cluster.fleet import GROUP_CLIENT

WINDOWS = {"windows": ["1h", "24h"]}


# the plug-in means exported for every series too: times the series' samples they are
# the window's sums, which add up over members as the counts do
SUMMED = ("mean_confidence", "accuracy", "brier", "nll", "observed_rate")
EXPORT_SUMS = {**WINDOWS, "export": {"segment_families": [
    "window_samples", *SUMMED, "ece_lower", "ece_upper", "smece"]}}


def member(tmp_path: Path, bootstrap: str, preds: str, labels: str, group: str,
           name: str, metrics: dict[str, Any] | None = None,
           library: str = "kafka-python") -> CalmonDaemon:
    """A member of ``group`` (not started), with a state dir and config of its own,
    reading with ``library`` (``kafka.library``)."""
    return CalmonDaemon(write_config(
        tmp_path / f"{name}.yaml", bootstrap, preds, labels,
        kafka={"group_id": group, "instance": "group", "client": GROUP_CLIENT,
               "library": library},
        metrics=metrics or WINDOWS, state={"checkpoint_interval": "1s"}),
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


def expected_sums(preds: list[dict[str, Any]], labels: list[dict[str, Any]]
                  ) -> dict[tuple[str, str], dict[str, float]]:
    """What ``summed_sums`` reads when every prediction has joined its label, computed
    from the records by the oracle's per-sample terms (``tests/oracle``)."""
    y = {lab["id"]: int(lab["label"]) for lab in labels}
    terms: dict[tuple[str, str], list[oracle.PerSample]] = {}
    for p in preds:
        one = np.array([y[p["id"]]])
        if "prob" in p:
            t = oracle.binary_terms(np.array([p["prob"]]), one)
        elif "logit" in p:
            t = oracle.binary_from_logits(np.array([p["logit"]]), one)
        elif "probs" in p:
            t = oracle.multiclass_terms(np.array([p["probs"]]), one)
        else:
            t = oracle.multiclass_from_logits(np.array([p["logits"]]), one)
        for segment in ["__all__", *(f"{k}={v}" for k, v in p["segment"].items())]:
            terms.setdefault((p["model"], segment), []).append(t)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key, parts in terms.items():
        s = oracle.concat(parts)
        out[key] = {"mean_confidence": float(s.conf.sum()), "accuracy": float(s.acc.sum()),
                    "brier": float(s.brier.sum()), "nll": float(s.nll.sum())}
        if s.binary:
            out[key]["observed_rate"] = float(s.correct.sum())
    return out


def assert_sums(got: dict[tuple[str, str], dict[str, float]],
                want: dict[tuple[str, str], dict[str, float]],
                counts: Counter[tuple[str, str]]) -> None:
    """Equal to 1e-9 relative, beyond the fixed point the window sums are kept in
    (2**-32 a confidence or Brier term, 2**-30 an NLL term, ``calmon.engine.windows``;
    ``counts``: the samples of each series, each term rounded once)."""
    assert got.keys() == want.keys(), (got.keys() - want.keys(), want.keys() - got.keys())
    for key, sums in want.items():
        assert got[key].keys() == sums.keys(), (key, got[key])
        for name, v in sums.items():
            quantum = (2.0**-30 if name == "nll" else 2.0**-32) * counts[key]
            assert abs(got[key][name] - v) <= 1e-9 * abs(v) + quantum, (key, name,
                                                                     got[key][name], v)


def summed_samples(daemons: list[CalmonDaemon], window: str = "24h"
                   ) -> Counter[tuple[str, str]]:
    """calmon_window_samples{window} summed over the running members."""
    out: Counter[tuple[str, str]] = Counter()
    for d in daemons:
        if not d.running:
            continue
        _add_counts(out, series(scrape(d.port), "calmon_window_samples", "model", "segment",
                                "window"), window)
    return out


def _add_counts(out: Counter[tuple[str, str]], n: dict[tuple[str, ...], float],
                window: str) -> None:
    """One member's calmon_window_samples{window} added into ``out``."""
    for (model, segment, w), v in n.items():
        if w == window and v:
            out[(model, segment)] += int(v)


def summed_sums(daemons: list[CalmonDaemon], window: str = "24h"
                ) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], dict[str, float]]]:
    """(the samples of each (model, segment), as ``summed_samples`` reads them; each of
    ``SUMMED`` times the series' samples: the window's sum of confidences, hits, Brier
    and NLL terms), both summed over the running members from ONE scrape of each, so a
    rebalance between two readings cannot pair one moment's counts with another's sums."""
    counts: Counter[tuple[str, str]] = Counter()
    out: dict[tuple[str, str], dict[str, float]] = {}
    for d in daemons:
        if not d.running:
            continue
        text = scrape(d.port)
        n = series(text, "calmon_window_samples", "model", "segment", "window")
        _add_counts(counts, n, window)
        for name in SUMMED:
            for (model, segment, w), v in series(text, f"calmon_{name}", "model", "segment",
                                                 "window").items():
                if w == window and n.get((model, segment, w)):
                    sums = out.setdefault((model, segment), {})
                    sums[name] = sums.get(name, 0.0) + v * n[(model, segment, w)]
    return counts, out


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (partition -> offset)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        got = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: int(om.offset) for tp, om in got.items() if tp.topic == topic}


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
    """Each member's group status and the tail of its log (what a failed wait shows)."""
    out = []
    for d in daemons:
        code, body = http_get(d.port, "/status") if d.running else (0, b"")
        out.append(json.dumps(json.loads(body).get("group") if code == 200 else code)[:3000])
        out.append(d.log_tail(12))
    return "\n".join(out)


def task_write(cfg: Config, offset: int) -> TaskWrite:
    """A checkpoint of an empty task at ``offset``, as a member's ``TaskLog`` writes it
    (for tests that drive ``Changelog.commit`` by hand)."""
    return TaskLog().write(Engine(cfg), {cfg.kafka.predictions_topic: offset}, offset)
