"""Backtest work (issue 39): a check reads in proportion to the samples labelled since
the last one. On a calibrated fleet (no alarm, no refit) every series that gained no
sample is skipped, so the samples the policy copies out of the rings in a check
(``Policy.samples_read``) are at most the samples the rings gained since the previous
check, plus a constant, however full the buffers are."""

from __future__ import annotations

import numpy as np

from tests.statistics.sim import Simulation, binary, sim_config

CONSTANT = 0  # samples a check may read beyond the new ones (none: each is read once)


def test_a_30_day_null_fleet_reads_only_its_new_samples() -> None:
    """10 segments at 200 samples a day each (per-segment detection, 11 series, 5-minute
    checks: most checks bring a series nothing), 30 days, 8,640 checks: the samples read
    in each check are at most those the rings gained since the previous check (counted
    from the rings' running totals, not by the policy), and over the run every sample
    is read exactly once, while the buffers hold up to 50,000 each."""
    cfg = sim_config(per_segment=True)
    sim = Simulation(cfg, binary(mu=-1.0, sd=1.0), segments=10, per_day=200, seed=5)
    seen = {sid: 0 for sid in range(11)}
    reads: list[tuple[int, int]] = []  # (read by the check, gained since the last one)
    idle = 0  # (series, check) pairs that gained nothing

    def on_check(s: Simulation, _events: object) -> None:
        nonlocal idle
        gained = 0
        for sid, ring in s.buffers.rings.items():
            gained += ring.total - seen[sid]
            idle += ring.total == seen[sid]
            seen[sid] = ring.total
        reads.append((s.policy.samples_read, gained))

    run = sim.run(30, on_check)
    assert run.events == []  # a null fleet: no drift, no refit
    assert len(reads) == 30 * 288
    over = [(i, r, g) for i, (r, g) in enumerate(reads) if r > g + CONSTANT]
    assert over == []
    assert sum(r for r, _ in reads) == sum(g for _, g in reads)
    assert idle > len(reads) * 3  # many segment checks bring nothing
    assert sim.buffers.rings[0].total > cfg.recalibration.buffer  # the model's ring is full


def test_the_checkpointed_state_of_skipped_series_is_their_state() -> None:
    """Skipped series keep their last snapshot (not copied again): after checks where
    most segments gained nothing, the policy's snapshot equals each state's own, taken
    afresh."""
    cfg = sim_config(per_segment=True)
    sim = Simulation(cfg, binary(mu=-1.0, sd=1.0), segments=10, per_day=200, seed=6,
                     readers=True)
    sim.run(1)
    got = sim.policy.snapshot()["series"]
    want = [[m, s, st.snapshot()] for (m, s), st in sorted(sim.policy.states.items())]
    assert [x[:2] for x in got] == [x[:2] for x in want] and len(got) == 11
    for (_, _, a), (_, _, b) in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            if k == "detector":
                for d in a[k]:
                    np.testing.assert_array_equal(a[k][d], b[k][d])
            else:
                assert a[k] == b[k]
