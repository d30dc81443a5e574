"""Acceptance 7: the refit sample buffer is bounded (``recalibration.buffer`` samples
per ring, whatever the traffic), keeps the newest joined samples in arrival order,
and survives a snapshot/restore of the engine (through the checkpoint codec)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calmon.engine.buffer import Ring
from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.io.checkpoint import decode, encode
from tests.recal_helpers import (
    BASE_TS,
    Stream,
    binary_logit_stream,
    feed,
    multiclass_logit_stream,
    recal_config,
)

CAPACITY = 500
COUNTRIES = ("US", "DE", "FR")


def with_segments(stream: Stream, rng: np.random.Generator) -> Stream:
    for p in stream.preds:
        p["segment"] = {"country": COUNTRIES[int(rng.integers(len(COUNTRIES)))]}
    return stream


def expected_ring(stream: Stream, model: str, segment: str) -> tuple[np.ndarray, ...]:
    """The newest CAPACITY joined samples of a series, oldest first (each prediction is
    fed right before its label, so join order is stream order)."""
    by_id = {lab["id"]: lab["label"] for lab in stream.labels}
    mine = [p for p in stream.preds if p["model"] == model
            and (segment == "__all__" or f"country={p['segment']['country']}" == segment)]
    mine = mine[-CAPACITY:]
    key = "logit" if "logit" in mine[0] else "logits"
    return (np.array([p["ts"] for p in mine]), np.array([by_id[p["id"]] for p in mine]),
            np.array([p[key] for p in mine], dtype=np.float64))


def assert_rings(engine: Engine, stream: Stream, series: set[tuple[str, str]]) -> None:
    got = {(m, s) for m, s, _ in engine.buffered_series()}
    assert got == series
    for model, segment in series:
        s = engine.samples(model, segment)
        assert s is not None
        ts, label, score = expected_ring(stream, model, segment)
        assert len(s) == len(ts) <= CAPACITY
        np.testing.assert_array_equal(s.ts, ts)
        np.testing.assert_array_equal(s.label, label)
        np.testing.assert_array_equal(s.score, score)


def test_buffer_is_bounded_per_ring_and_survives_snapshot_restore(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path, segments={"slices": [["country"]]},
                       recalibration={"buffer": CAPACITY, "per_segment": True})
    rng = np.random.default_rng(5)
    stream = with_segments(binary_logit_stream(rng, "bin", 3000, BASE_TS, 3000.0), rng)
    stream.extend(with_segments(
        multiclass_logit_stream(rng, "mc", 240, 4, BASE_TS + 3000, 600.0), rng))
    engine = Engine(cfg)
    feed(engine, stream, chunk=777)
    series = {("bin", "__all__"), ("mc", "__all__")}
    series |= {(m, f"country={c}") for m in ("bin", "mc") for c in COUNTRIES}
    assert_rings(engine, stream, series)
    assert len(engine.samples("bin", "__all__")) == CAPACITY  # 3000 joined, 500 kept
    assert len(engine.samples("mc", "__all__")) == 240  # not full yet

    # through the checkpoint's own codec into a fresh engine
    restored = Engine(cfg)
    restored.restore(decode(encode(engine.snapshot())))
    assert_rings(restored, stream, series)

    # both keep going identically (the ring's write position survived too)
    more = with_segments(binary_logit_stream(rng, "bin", 1700, BASE_TS + 4000, 600.0,
                                             prefix="more"), rng)
    more.extend(with_segments(
        multiclass_logit_stream(rng, "mc", 400, 4, BASE_TS + 4600, 600.0, prefix="more"), rng))
    feed(engine, more, chunk=333)
    feed(restored, more)
    stream.extend(more)
    assert_rings(engine, stream, series)
    assert_rings(restored, stream, series)


def test_without_per_segment_only_the_models_ring_is_kept(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path, segments={"slices": [["country"]]},
                       recalibration={"buffer": CAPACITY, "per_segment": False})
    rng = np.random.default_rng(6)
    stream = with_segments(binary_logit_stream(rng, "bin", 5000, BASE_TS, 3000.0), rng)
    engine = Engine(cfg)
    feed(engine, stream, chunk=10_000)  # one batch far larger than the ring
    assert_rings(engine, stream, {("bin", "__all__")})
    assert any(r.segment == "country=US" for r in full_snapshot(engine).rows)  # the series exists
    assert engine.samples("bin", "country=US") is None  # ... without a ring


def test_a_ring_grows_as_it_fills_and_always_holds_the_newest_in_order() -> None:
    """Rings start small and double up to capacity (a quiet series costs what it holds);
    whatever the sizes of the extends, the contents are the newest ``capacity`` samples
    in arrival order, as a plain list says, and ``last`` reads the newest of them."""
    rng = np.random.default_rng(8)
    for capacity, classes in ((1, 0), (300, 0), (1000, 0), (777, 4), (5000, 3)):
        ring = Ring(capacity, classes)
        assert len(ring.ts) <= max(Ring.INITIAL, 1)  # not capacity rows up front
        seen: list[float] = []
        for _ in range(40):
            n = int(rng.choice([0, 1, 5, 255, 256, 257, 600, 1500]))
            ts = np.arange(len(seen), len(seen) + n, dtype=float)
            score = rng.random(n) if classes == 0 else rng.random((n, classes))
            ring.extend(ts, ts.astype(np.int32) % 7, np.full(n, 2, np.int8), score)
            seen += ts.tolist()
            got = ring.samples()
            assert got.ts.tolist() == seen[-capacity:]
            assert got.label.tolist() == [int(t) % 7 for t in seen[-capacity:]]
            assert got.score.shape == ((len(got),) if classes == 0 else (len(got), classes))
            assert ring.samples(3).ts.tolist() == seen[-capacity:][-3:]
            assert ring.total == len(seen) and len(ring.ts) <= capacity
