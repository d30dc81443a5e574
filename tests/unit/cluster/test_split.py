"""A batch larger than one Kafka record is cut in parts that each fit (issue 35 item 6):
the parts hold every sample once, in order, their ``added`` sum to the batch's, and the
owner takes each part once (a re-sent part is a copy)."""

from __future__ import annotations

import numpy as np

from calmon import config as config_mod
from calmon.cluster.batch import JoinedBatch, Series, decode, encode, split
from calmon.cluster.owner import Owner
from calmon.cluster.sender import DEFAULT_MAX_BYTES, JoinedSender
from calmon.engine.buffer import SampleSet
from calmon.engine.records import ScoreKind
from calmon.engine.series import ALL
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry

T0 = 1_700_000_000.0


def samples(rng: np.random.Generator, n: int, k: int = 0) -> SampleSet:
    ts = T0 + np.sort(rng.uniform(0, 3600, n))
    if k:
        return SampleSet(ts, rng.integers(0, k, n).astype(np.int32),
                         np.full(n, int(ScoreKind.PROBS), np.int8),
                         rng.dirichlet(np.ones(k), n), 0)
    return SampleSet(ts, rng.integers(0, 2, n).astype(np.int32),
                     np.full(n, int(ScoreKind.LOGIT), np.int8), rng.normal(size=n), 0)


def owner() -> Owner:
    cfg = config_mod.from_dict({"recalibration": {"buffer": 200_000}})
    return Owner(Policy(cfg, Registry(None)), cfg.recalibration.buffer)


def test_a_large_batch_is_cut_into_parts_that_fit_and_hold_every_sample_once() -> None:
    rng = np.random.default_rng(3)
    big, seg, multi = samples(rng, 50_000), samples(rng, 7_000), samples(rng, 9_000, 5)
    b = JoinedBatch("ctr", T0 + 3600, 1, {("predictions", 1): (10, 260_010)},
                    [Series(ALL, 0, 60_000, big), Series("country=US", 0, 7_000, seg),
                     Series("country=FR", 5, 9_000, multi)])
    # 50,000 x 21 bytes alone are over one MiB: what the producer refused before
    assert len(encode(b)) > 1 << 20
    budget = DEFAULT_MAX_BYTES
    parts = split(b, budget)
    data = [encode(p) for p in parts]
    assert len(parts) == -(-len(encode(b)) // budget)  # no more parts than needed
    assert all(len(d) <= budget for d in data)
    back = [decode(d) for d in data]
    assert [p.part for p in back] == [(i, len(parts)) for i in range(len(parts))]
    assert all((p.model, p.now, p.sender, p.source) == (b.model, b.now, b.sender, b.source)
               for p in back)
    for want in b.series:
        got = [s for p in back for s in p.series if s.segment == want.segment]
        assert sum(s.added for s in got) == want.added
        for col in ("ts", "label", "kind", "score"):
            np.testing.assert_array_equal(
                np.concatenate([getattr(s.samples, col) for s in got]),
                getattr(want.samples, col))
    # the owner takes every part once; re-sent parts are copies
    o = owner()
    assert [o.accept(0, i, d) for i, d in enumerate(data)] == [True] * len(data)
    assert [o.accept(0, len(data) + i, d) for i, d in enumerate(data)] == [False] * len(data)
    assert o.sample_count("ctr") == 60_000 and o.duplicates == len(data)
    got = o.samples_of("ctr", ALL)
    assert got is not None
    np.testing.assert_array_equal(got.ts, big.ts)
    # a small batch stays whole
    small = JoinedBatch("ctr", T0, 0, {("predictions", 0): (0, 5)},
                        [Series(ALL, 0, 5, samples(rng, 5))])
    assert split(small, budget) == [small]


class Source:
    """What the sender reads of an engine: one model's ring."""

    def __init__(self, x: SampleSet) -> None:
        self.x = x

    def buffered_series(self) -> list[tuple[str, str, int]]:
        return [("big", ALL, 0)]

    def samples(self, model: str, segment: str, last: int | None = None) -> SampleSet | None:
        return self.x if last is None else SampleSet(
            self.x.ts[len(self.x) - last:], self.x.label[len(self.x) - last:],
            self.x.kind[len(self.x) - last:], self.x.score[len(self.x) - last:],
            self.x.total) if last else SampleSet(self.x.ts[:0], self.x.label[:0],
                                                 self.x.kind[:0], self.x.score[:0],
                                                 self.x.total)

    def now_of(self, model: str) -> float:
        return float(self.x.ts.max())


def test_the_sender_sends_a_catch_up_in_records_the_producer_takes() -> None:
    rng = np.random.default_rng(4)
    x = samples(rng, 50_000)
    ring = SampleSet(x.ts, x.label, x.kind, x.score, 120_000)  # the ring lost 70,000
    sender = JoinedSender(0, 50_000)
    assert sender.collect(Source(ring), {("predictions", 0): 240_000}) == 1
    assert len(sender.pending) >= 2
    assert all(len(v) <= DEFAULT_MAX_BYTES and k == b"big" for k, v in sender.pending)
    o = owner()
    assert sender.flush(lambda batch: all(o.accept(0, i, v) for i, (_k, v) in
                                          enumerate(batch)))
    assert o.sample_count("big") == 120_000


def test_the_budget_follows_the_producers_max_request_size() -> None:
    from calmon.cluster.kafka import record_budget

    small = config_mod.from_dict({"kafka": {"client": {"max_request_size": 300_000}}})
    assert record_budget(small.kafka) == 300_000 - 16 * 1024
    default = config_mod.from_dict({})
    assert record_budget(default.kafka) == DEFAULT_MAX_BYTES == (1 << 20) - 16 * 1024
    rng = np.random.default_rng(5)
    b = JoinedBatch("ctr", T0, 0, {("predictions", 0): (0, 30_000)},
                    [Series(ALL, 0, 30_000, samples(rng, 30_000))])
    parts = split(b, record_budget(small.kafka))
    assert len(parts) == 3 and all(len(encode(p)) <= 300_000 - 16 * 1024 for p in parts)
