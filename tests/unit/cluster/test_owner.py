"""The owner's code in memory: batches as bytes, dedup by source offset, and the one
Policy over every sender's samples (contract §7)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmon import config as config_mod
from calmon.cluster.batch import BatchError, JoinedBatch, Series, decode, encode
from calmon.cluster.owner import Owner
from calmon.cluster.sender import JoinedSender
from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine
from calmon.engine.records import ScoreKind
from calmon.engine.series import ALL
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry
from tests.recal_helpers import feed_pairs


def sample_set(ts: np.ndarray, label: np.ndarray, score: np.ndarray,
               kind: ScoreKind = ScoreKind.LOGIT) -> SampleSet:
    return SampleSet(ts.astype(float), label.astype(np.int32),
                     np.full(len(ts), int(kind), np.int8), score.astype(float), 0)


def test_a_batch_round_trips_and_broken_bytes_are_refused() -> None:
    rng = np.random.default_rng(1)
    binary = sample_set(np.arange(5.0), rng.integers(0, 2, 5), rng.normal(size=5))
    multi = sample_set(np.arange(3.0), rng.integers(0, 4, 3), rng.dirichlet(np.ones(4), 3),
                       ScoreKind.PROBS)
    b = JoinedBatch("ctr", 12.5, 2, {("preds", 3): (10, 20), ("labels", 3): (0, 7)},
                    [Series(ALL, 0, 6, binary), Series("country=US", 4, 3, multi)])
    data = encode(b)
    back = decode(data)
    assert (back.model, back.now, back.sender, back.source) == (
        "ctr", 12.5, 2, {("preds", 3): (10, 20), ("labels", 3): (0, 7)})
    for got, want in zip(back.series, b.series, strict=True):
        assert (got.segment, got.classes, got.added) == (want.segment, want.classes,
                                                         want.added)
        for col in ("ts", "label", "kind", "score"):
            np.testing.assert_array_equal(getattr(got.samples, col),
                                          getattr(want.samples, col))
    # columns, not a JSON record per sample: the bytes are the header plus 21 a sample
    assert len(data) < 400 + 5 * 21 + 3 * (13 + 32)
    for cut in range(0, len(data), 7):
        with pytest.raises(BatchError):
            decode(data[:cut])
    with pytest.raises(BatchError):
        decode(data + b"x")
    with pytest.raises(BatchError):
        decode(b"CMJ1" + (5).to_bytes(4, "big") + b"[1,2]")


def records(n: int, seed: int, model: str = "m") -> list[tuple[dict, dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        logit = float(rng.normal())
        y = int(rng.random() < 1 / (1 + math.exp(-logit)))
        out.append(({"id": f"{seed}-{i}", "model": model, "ts": 1_700_000_000.0 + i,
                     "logit": logit}, {"id": f"{seed}-{i}", "label": y}))
    return out


def owner_of(cfg: config_mod.Config) -> Owner:
    return Owner(Policy(cfg, Registry(None)), cfg.recalibration.buffer)


def test_every_senders_samples_reach_the_owner_once_even_when_sent_again() -> None:
    cfg = config_mod.from_dict({"recalibration": {"buffer": 10_000}})
    owner = owner_of(cfg)
    data = {i: records(300, seed=i) for i in range(3)}
    senders, engines = [], []
    for i in range(3):
        engine, sender = Engine(cfg), JoinedSender(i)
        feed_pairs(engine, data[i][:200], i, 0)
        sender.collect(engine, {("predictions", i): 200, ("labels", i): 200})
        engines.append(engine)
        senders.append(sender)
    # sender 1 "crashes" after its checkpoint (pending in it) but before the ack:
    crashed = senders[1].snapshot()
    offset = 0
    for s in senders:
        for _key, value in s.pending:
            owner.accept(0, offset, value)
            offset += 1
        s.flush(lambda batch: True)
    again = JoinedSender(1)
    again.restore(crashed)
    assert again.pending  # the restored checkpoint still holds the batch
    for _key, value in again.pending:
        assert not owner.accept(0, offset, value)  # dropped by its source offsets
        offset += 1
    again.flush(lambda batch: True)
    # then every instance goes on: the next checkpoint's samples are new
    for i, s in enumerate([senders[0], again, senders[2]]):
        feed_pairs(engines[i], data[i][200:], i, 200)
        s.collect(engines[i], {("predictions", i): 300, ("labels", i): 300})
        for _key, value in s.pending:
            assert owner.accept(0, offset, value)
            offset += 1
    assert owner.duplicates == 1
    assert owner.sample_count("m") == 900
    got = owner.samples_of("m", ALL)
    assert got is not None
    want = sorted((p["ts"], p["logit"], lab["label"]) for i in range(3)
                  for p, lab in data[i])
    assert sorted(zip(got.ts.tolist(), got.score.tolist(), got.label.tolist(),
                      strict=True)) == want
    # the owner's state restores whole, offsets included
    other = owner_of(cfg)
    other.restore(owner.snapshot())
    other.assign({0})  # the partition's state, set aside by the restore, is its own again
    assert other.models([0]) == ["m"] and other.partition_of("m") == 0
    assert other.sample_count("m") == 900 and other.offsets == {0: offset}
    assert not other.accept(0, offset, again.pending[0][1] if again.pending else
                            encode(JoinedBatch("m", 0.0, 1, {("labels", 1): (0, 300)}, [])))


def drifting(rng: np.random.Generator, n: int, t0: float, change: float | None,
             per_s: float) -> SampleSet:
    """Calibrated logits; after ``change`` the model's logits are 2.5x too sharp."""
    ts = t0 + np.arange(n) / per_s
    z = rng.normal(0.0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    shown = z if change is None else np.where(ts >= change, 2.5 * z, z)
    return sample_set(ts, y, shown)


def run(owner: Owner, streams: dict[str, SampleSet], senders: int, step_s: float,
        t_end: float, t0: float) -> list:
    """Each model's samples dealt round-robin to ``senders`` instances, one batch per
    sender per check interval, then one owner check."""
    events = []
    pos: dict[tuple[str, int], int] = {}
    t = t0
    while t < t_end:
        t += step_s
        for model, s in streams.items():
            for i in range(senders):
                mine = (np.arange(len(s)) % senders == i) & (s.ts < t) & (s.ts >= t - step_s)
                part = s.select(mine)
                if not len(part):
                    continue
                tp = (f"predictions-{model}", i)
                start = pos.get(tp, 0)
                pos[tp] = start + len(part)
                b = JoinedBatch(model, float(part.ts.max()), i, {tp: (start, pos[tp])},
                                [Series(ALL, 0, len(part), part)])
                owner.accept(0, 0, encode(b))
        events += owner.check()
    return events


def test_a_drift_clears_min_samples_only_across_instances_and_is_published() -> None:
    """min_samples 1500: each of three instances sees about 700 post-change samples of
    the day, together about 2100. The fit uses more than any one instance has."""
    cfg = config_mod.from_dict({"recalibration": {
        "min_samples": 1500, "buffer": 20_000, "alpha": 0.01, "interval": "10m",
        "cooldown": "1h", "window": "24h", "method": "temperature"}})
    owner = owner_of(cfg)
    rng = np.random.default_rng(11)
    t0, per_s = 1_700_000_000.0, 4000 / 86400
    change = t0 + 86400
    streams = {"ctr": drifting(rng, 8000, t0, change, per_s)}
    events = run(owner, streams, 3, 600.0, t0 + 2 * 86400, t0)
    published = [e for e in events if e.kind == "published"]
    assert len(published) == 1, [e.kind for e in events]
    e = published[0]
    post = int((streams["ctr"].ts >= change).sum())
    per_instance = post / 3
    assert e.fields["fit_samples"] + e.fields["holdout_samples"] > per_instance
    assert e.fields["fit_samples"] + e.fields["holdout_samples"] >= cfg.recalibration.min_samples
    live = owner.policy.live("ctr", ALL)
    assert live is not None and live.version == 1
    # the temperature undoes the 2.5x sharpening (independent of the code: 1/2.5 = 0.4)
    assert 1.8 < float(live.doc["params"]["temperature"]) < 3.4


def test_calibrated_streams_over_three_instances_alarm_at_most_at_alpha() -> None:
    """120 calibrated models, each spread over three senders, one owner each: the
    fraction whose detector alarms within four days stays within alpha (0.2), up to
    the binomial noise of 120 draws."""
    alpha, n_models = 0.2, 120
    cfg = config_mod.from_dict({"limits": {"max_models": n_models}, "recalibration": {
        "min_samples": 10**7, "buffer": 5000, "alpha": alpha, "interval": "6h",
        "window": "24h"}})
    owner = owner_of(cfg)
    rng = np.random.default_rng(2026)
    t0 = 1_700_000_000.0
    streams = {f"m{i}": drifting(rng, 2000, t0, None, 2000 / (4 * 86400))
               for i in range(n_models)}
    run(owner, streams, 3, 6 * 3600.0, t0 + 4 * 86400, t0)
    alarmed = sum(st.detector.alarmed for st in owner.policy.states.values())
    assert len(owner.policy.states) == n_models
    assert owner.sample_count("m0") == 2000  # every sender's share reached the owner
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / n_models)
    assert alarmed / n_models <= bound, alarmed


def test_a_partition_moved_away_is_forgotten_and_read_again_when_it_returns() -> None:
    """What an owner held of a partition it lost (a rebalance, or a fenced publish) is
    dropped whole: rings, marks, clock, offsets and the policy's state of its models;
    the other partitions' models keep theirs."""
    cfg = config_mod.from_dict({"recalibration": {"buffer": 10_000, "min_samples": 50}})
    owner = owner_of(cfg)
    for part, model in ((0, "a"), (1, "b")):
        engine, sender = Engine(cfg), JoinedSender(part)
        feed_pairs(engine, records(100, seed=part, model=model), part, 0)
        sender.collect(engine, {("predictions", part): 100, ("labels", part): 100})
        for i, (_key, value) in enumerate(sender.pending):
            assert owner.accept(part, i, value)
    owner.check()
    assert {m for m, _ in owner.policy.states} == {"a", "b"}
    owner.revoke({0, 1})  # an eager rebalance revokes everything...
    assert owner.parts == {} and owner.models() == ["a", "b"]  # (set aside, checkpointed)
    owner.assign({0})  # ...and hands partition 0 back: 1 went to another owner
    assert owner.models() == ["a"] and owner.partition_of("b") is None
    assert owner.partition_of("a") == 0
    assert owner.sample_count("b") == 0 and owner.sample_count("a") == 100
    assert set(owner.offsets) == {0} and owner.now_of("b") == -math.inf
    assert all(row[0] != "b" for row in owner.snapshot()["seen"])
    assert {m for m, _ in owner.policy.states} == {"a"}
    assert {row[0] for row in owner.policy.snapshot()["series"]} == {"a"}
    owner.drop({0})  # fenced at a publish: dropped at once
    assert owner.models() == [] and owner.offsets == {} and owner.policy.states == {}


def test_an_unacknowledged_backlog_stays_bounded_and_the_owner_exact() -> None:
    """joined_topic down for five checkpoints: the sender keeps only the newest batches
    that fill the owner's ring (capacity 100), not all 300 samples, and when the broker
    is back the owner counts all 300 and holds exactly the newest 100."""
    cfg = config_mod.from_dict({"recalibration": {"buffer": 100}})
    engine, sender = Engine(cfg), JoinedSender(0, cfg.recalibration.buffer)
    data = records(300, seed=5)
    for k in range(5):
        feed_pairs(engine, data[60 * k:60 * (k + 1)], 0, 60 * k)
        sender.collect(engine, {("predictions", 0): 60 * (k + 1), ("labels", 0): 60 * (k + 1)})
        assert not sender.flush(lambda batch: False)  # the broker does not answer
    assert len(sender.pending) == 2  # 60 + 60 >= 100: the three older ones are gone
    assert sum(len(decode(v)) for _k, v in sender.pending) == 120
    owner = owner_of(cfg)
    assert sender.flush(lambda batch: all(owner.accept(0, i, v)
                                          for i, (_k, v) in enumerate(batch)))
    assert owner.sample_count("m") == 300
    got = owner.samples_of("m", ALL)
    assert got is not None
    want = [(p["ts"], p["logit"], lab["label"]) for p, lab in data[200:]]
    assert list(zip(got.ts.tolist(), got.score.tolist(), got.label.tolist(),
                    strict=True)) == want
