"""The recalibration driver (calmon.recal.driver), shared by the in-process loop and
the scaled-out owner: what the loop shows its readers is its own, not patched in by
the daemon (issue 32 item 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calmon.engine.engine import Engine
from calmon.recal.loop import Recalibrator
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream, feed, recal_config


def test_the_loop_pre_creates_the_counters_of_every_method_auto_may_pick(
        tmp_path: Path) -> None:
    """Before any run: every buffered series, every method ``auto`` may report (the
    daemon used to overwrite the loop's list, which named ``auto`` itself)."""
    cfg = recal_config(tmp_path, recalibration={"method": "auto"})
    engine = Engine(cfg)
    rng = np.random.default_rng(1)
    feed(engine, Stream().extend(binary_logit_stream(rng, "bin", 200, BASE_TS, 600.0)))
    state = Recalibrator(cfg, engine).metrics_state()
    assert state.methods == ("temperature", "platt", "isotonic", "histogram")
    assert state.series == [("bin", "__all__")]
