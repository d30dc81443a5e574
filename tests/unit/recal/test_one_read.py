"""The policy reads each series' ring once per check (issue 32 item 4): every read of a
check (what is new, the post-change samples, a refit's) is a tail of one copy, so a
check sees one state of the ring however the engine feeds meanwhile."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream, feed, recal_config

HOUR = 3600.0


def test_a_check_that_alarms_and_refits_reads_each_ring_once(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    rng = np.random.default_rng(3)
    s = Stream()
    s.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(binary_logit_stream(rng, "bin", 6000, BASE_TS + 5 * HOUR, 2400.0, scale=2.5,
                                 prefix="b"))
    feed(engine, s)
    policy = Policy(cfg, Registry(cfg.recalibration.output_dir))
    reads: Counter[tuple[str, str]] = Counter()

    def samples_of(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        reads[(model, segment)] += 1
        return engine.samples(model, segment, last)

    events = policy.check_each(engine.now_of, [("bin", "__all__")], samples_of)
    # the check did everything that reads the ring: detection, the triggers, a refit
    assert {e.kind for e in events} == {"drift", "published"}, events
    assert reads == {("bin", "__all__"): 1}
