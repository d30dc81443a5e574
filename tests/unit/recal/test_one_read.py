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
from calmon.recal.detect import Detector
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry
from calmon.recal.skip import Untouched
from calmon.recal.state import SeriesState
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream, feed, raws, recal_config

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


def test_a_series_not_named_new_is_passed_over_unread(tmp_path: Path) -> None:
    """``check_each(new=...)`` (replay names the series its feeds joined samples into):
    a quiet series left out is not read at all, not even its total; named again once it
    gains samples, it reads exactly those."""
    cfg = recal_config(tmp_path)
    calm = Engine(cfg)
    feed(calm, binary_logit_stream(np.random.default_rng(5), "bin", 3000, BASE_TS, 6 * HOUR))
    policy = Policy(cfg, Registry(None))
    t = calm.now_of("bin")
    copies: list[int | None] = []

    def samples_of(model: str, segment: str, last: int | None = None) -> SampleSet | None:
        copies.append(last)
        return calm.samples(model, segment, last)

    assert policy.check_each(lambda _m: t, SERIES, samples_of, new=SERIES) == []
    first = len(copies)
    assert first > 0 and policy.states[SERIES[0]].seen == 3000
    assert policy.check_each(lambda _m: t + 300.0, SERIES, samples_of, new=[]) == []
    assert len(copies) == first and policy.samples_read == 0  # not even its total
    feed(calm, binary_logit_stream(np.random.default_rng(6), "bin", 40, t + 1.0, 60.0,
                                   prefix="n"))
    assert policy.check_each(lambda _m: t + 600.0, SERIES, samples_of, new=SERIES) == []
    assert policy.samples_read == 40 and policy.states[SERIES[0]].seen == 3040


def test_named_new_or_not_the_checks_decide_the_same(tmp_path: Path) -> None:
    """A drift caught and published, with checks that bring nothing new in between:
    naming the series each feed joined samples into decides exactly what reading every
    series decides, event for event, and leaves the same state after every check."""
    records = raws(drifted(3))
    runs = []
    for hinted in (False, True):
        cfg = recal_config(tmp_path / str(hinted))
        engine = Engine(cfg)
        policy = Policy(cfg, Registry(None))
        events, states, new = [], [], set()
        for i in range(0, len(records), 500):
            engine.feed(records[i:i + 500])
            new.update(engine.last_delta.bins)
            for extra in (0.0, 900.0, 1800.0):  # later checks bring nothing new
                now = engine.now_of("bin") + extra
                events += [e.as_dict() for e in policy.check_each(
                    lambda _m, t=now: t, SERIES, engine.samples,
                    new=set(new) if hinted else None)]
                new.clear()
                st = policy.states.get(SERIES[0])
                states.append(None if st is None else (
                    st.detector.k, st.seen, 0 if st.held is None else len(st.held),
                    st.detector.log_m, st.basis))
        policy.publish_readers()
        runs.append((json.dumps(events, default=str), states, policy.snapshot()))
    (plain, plain_states, plain_snap), (named, named_states, named_snap) = runs
    assert {e["kind"] for e in json.loads(plain)} >= {"drift", "published"}
    assert named == plain
    assert named_states == plain_states
    assert [s[:2] for s in named_snap["series"]] == [s[:2] for s in plain_snap["series"]]
    for (_, _, a), (_, _, b) in zip(named_snap["series"], plain_snap["series"]):
        for k in a["detector"]:
            np.testing.assert_array_equal(a["detector"][k], b["detector"][k])
        assert {k: v for k, v in a.items() if k != "detector"} == {
            k: v for k, v in b.items() if k != "detector"}


def test_what_a_check_may_pass_over_unread() -> None:
    """skip.Untouched: a series not named new is passed over only while its state is
    quiet and no calibrator was published since the last check; an alarmed one, a new
    one, and every one after a publish or a restore are checked."""
    quiet_st = SeriesState(Detector.new(), (None, None), 10, 10)
    alarmed = SeriesState(Detector.new(), (None, None), 10, 10)
    alarmed.detector.alarm_k = 10
    states = {("m", "a"): quiet_st, ("m", "b"): alarmed}
    keys = [("m", "a"), ("m", "b"), ("m", "c")]
    u = Untouched()
    assert u.candidates(keys, None, 0, states) == keys  # the caller does not know
    assert u.candidates(keys, [], 0, states) == keys  # the first named check: all
    for k in keys:
        u.checked(k, states.get(k))
    assert u.candidates(keys, [], 0, states) == [("m", "b"), ("m", "c")]  # alarmed, new
    assert u.candidates(keys, [("m", "a")], 0, states) == keys
    assert u.candidates(keys, [], 0, states) == keys  # ("m", "a") named, not checked yet
    u.checked(("m", "a"), quiet_st)
    assert u.candidates(keys, [], 0, states) == [("m", "b"), ("m", "c")]
    assert u.candidates(keys, [], 1, states) == keys  # a publish: every basis may move
    assert u.candidates(keys, [], 1, states) == [("m", "b"), ("m", "c")]
    u.reset()  # a restore
    assert u.candidates(keys, [], 1, states) == keys
    assert u.candidates(keys, [], None, states) == keys  # documents on disk: always all
