"""A check sees one state of each ring (issue 32 item 4) and copies in proportion to
what it reads (issue 39): every read of a check (the total, what is new, the
post-change samples, a refit's) is a tail of the ring as it stood at the check's first
read of it, however the engine feeds meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream, feed, recal_config

HOUR = 3600.0
SERIES = [("bin", "__all__")]


def drifted(seed: int) -> Stream:
    rng = np.random.default_rng(seed)
    s = Stream()
    s.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(binary_logit_stream(rng, "bin", 6000, BASE_TS + 5 * HOUR, 2400.0, scale=2.5,
                                 prefix="b"))
    return s


def check(tmp_path: Path, feeding: bool) -> tuple[list[dict], list[tuple[int | None, int]]]:
    """One check of a series that alarms and refits; with ``feeding``, 3,000 more
    samples of the same regime reach the ring right after the check's first read."""
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    feed(engine, drifted(3))
    now = engine.now_of("bin")
    more = binary_logit_stream(np.random.default_rng(9), "bin", 3000, BASE_TS + 5 * HOUR,
                               2400.0, scale=2.5, prefix="c")
    copies: list[tuple[int | None, int]] = []

    def samples_of(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        got = engine.samples(model, segment, last)
        copies.append((last, 0 if got is None else len(got)))
        if feeding and len(copies) == 1:
            feed(engine, more)
        return got

    policy = Policy(cfg, Registry(cfg.recalibration.output_dir))
    events = policy.check_each(lambda _m: now, SERIES, samples_of)
    out = [{"kind": e.kind, **{k: v for k, v in e.fields.items() if k != "fitted_at"}}
           for e in events]
    return json.loads(json.dumps(out, default=str)), copies


def test_a_check_sees_the_ring_as_it_stood_at_its_first_read(tmp_path: Path) -> None:
    quiet, copies = check(tmp_path / "quiet", feeding=False)
    # the check did everything that reads the ring: detection, the triggers, a refit
    assert {e["kind"] for e in quiet} == {"drift", "published"}, quiet
    busy, busy_copies = check(tmp_path / "busy", feeding=True)
    # the 3,000 samples fed after the first read change nothing the check decided
    # (they would show in fit_samples, the holdout and the ECEs)
    assert busy == quiet
    # what was copied: the total (nothing), then the whole ring once for the refit
    assert copies[0] == (0, 0)
    assert sum(1 for last, _ in copies if last is None) <= 1
    assert len(busy_copies) <= len(copies) + 1  # once more to cut back to the first state


def test_an_idle_series_costs_its_total_alone(tmp_path: Path) -> None:
    """A calm series checked again with nothing new: one read of its total, no copy."""
    cfg = recal_config(tmp_path)
    calm = Engine(cfg)
    feed(calm, binary_logit_stream(np.random.default_rng(5), "bin", 3000, BASE_TS,
                                   6 * HOUR))
    policy = Policy(cfg, Registry(cfg.recalibration.output_dir))
    t = calm.now_of("bin")
    assert policy.check_each(lambda _m: t, SERIES, calm.samples) == []
    copies: list[int] = []

    def samples_of(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        got = calm.samples(model, segment, last)
        copies.append(0 if got is None else len(got))
        return got

    assert policy.check_each(lambda _m: t + 300.0, SERIES, samples_of) == []
    assert copies == [0], copies
    assert policy.samples_read == 0
