"""The input and config of ``v1_checkpoint.calmon``: a checkpoint written by calmon's
format 1 (commit 3743a54, dense bucket vectors in an ``.npz``), kept so that every
later format is tested to restore it with the same numbers.

Run as a script it writes the fixture again (only meaningful on the code that wrote
format 1): ``python -m tests.unit.io.checkpoint_fixture``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from calmon.config import Config, from_dict
from calmon.engine.records import Raw
from tests.oracle import T0, L, P

FIXTURE = Path(__file__).with_name("v1_checkpoint.calmon")
POSITIONS = {("predictions", 0): 812, ("labels", 0): 790}
WRITTEN_AT = 1_764_600_000.0


def config() -> Config:
    # small bins keep the dense vectors of format 1, and so the fixture, small
    return from_dict({
        "metrics": {"bins": 8, "fine_bins": 16, "windows": ["1h", "24h"], "classwise": True},
        "segments": {"slices": [["country"], ["country", "device"]], "max_values": 3},
        "recalibration": {"buffer": 300},
        "join": {"missing_label": None},
    })


def batches(part: int) -> list[list[Raw]]:
    """Part 0 is what the fixture holds; part 1 is fed after the restore."""
    rng = random.Random(1901 + part)
    out: list[list[Raw]] = []
    base = T0 + part * 5400
    for b in range(6):
        raws: list[Raw] = []
        for i in range(60):
            pid = f"p{part}-{b}-{i}"
            ts = base + rng.uniform(0, 30 * 3600) * (0.1 if i % 3 else 1.0)
            seg = {"country": rng.choice(["US", "FR", "DE", "IT", "ES"]),
                   "device": rng.choice(["ios", "web"])}
            k = i % 4
            if k == 0:
                raws.append(P(pid, ts, "bin", prob=rng.random(), segment=seg))
            elif k == 1:
                raws.append(P(pid, ts, "lg", logit=rng.gauss(0, 3), segment=seg))
            else:
                w = [rng.random() for _ in range(3)]
                raws.append(P(pid, ts, "k3", probs=[x / sum(w) for x in w], segment=seg))
            if i % 7:  # some stay pending
                raws.append(L(pid, rng.randrange(2 if k < 2 else 3), ts + rng.uniform(0, 600)))
        raws.append(L(f"orphan-{part}-{b}", 1))  # a label waiting for its prediction
        out.append(raws)
    # every model's newest prediction at the same time, so each model's own event time
    # (contract v3) is the instance's, as format 1's single one was
    last = base + 31 * 3600
    out[-1] += [P(f"last-{part}-bin", last, "bin", prob=0.7), L(f"last-{part}-bin", 1),
                P(f"last-{part}-lg", last, "lg", logit=0.3), L(f"last-{part}-lg", 0),
                P(f"last-{part}-k3", last, "k3", probs=[0.2, 0.5, 0.3]), L(f"last-{part}-k3", 1)]
    return out


def state() -> dict[str, Any]:
    from calmon.engine.engine import Engine

    e = Engine(config())
    for raws in batches(0):
        e.feed(raws)
    return {"engine": e.snapshot()}


if __name__ == "__main__":
    import shutil
    import tempfile

    from calmon.io.checkpoint import CheckpointStore

    with tempfile.TemporaryDirectory() as d:
        path = CheckpointStore(d).save(state(), POSITIONS, WRITTEN_AT)
        shutil.copyfile(path, FIXTURE)
    print(FIXTURE, FIXTURE.stat().st_size)
