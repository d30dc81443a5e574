"""The demo's story on its own traffic, through the real engine and policy in event time.

The newcomer saw 27 drift lines in 150 s, two of them ("drift fraud/__all__", a second
"drift ctr/__all__") never followed by anything. Every alarm now ends in what happened
to it, alarms of one model in one check are one line, and the end of the run says what
became of each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from calmon.demo.narrate import Narrator
from calmon.demo.run import demo_config
from calmon.demo.traffic import Traffic
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry

START = 1_764_460_800.0
# what a drift line or an open alarm may end with: each names what happens next
STATES = re.compile("|".join([
    r"refitted at once \(below\)", r"still collecting post-change samples: \d+ of 300",
    r"refit due at the next check", r"the drift looks local to some segments",
    r"in its cooldown for", r"after a rejected refit: retried at \d+ post-change samples",
    r"its triggers no longer fire"]))


def _story(tmp_path: Path, seconds: float = 120.0) -> tuple[list[str], list[str], int]:
    cfg = demo_config("unused:9092", 0, tmp_path)
    preds, labels = Traffic("unused:9092", "predictions", "labels", rate=300.0,
                            seed=7).timeline(seconds, START)
    records = sorted([(float(p["ts"]), 0, i, Raw(Kind.PREDICTION, json.dumps(p).encode()))
                      for i, p in enumerate(preds)]
                     + [(float(lab["ts"]), 1, i, Raw(Kind.LABEL, json.dumps(lab).encode()))
                        for i, lab in enumerate(labels)], key=lambda r: r[:3])
    engine = Engine(cfg)
    policy = Policy(cfg, Registry(None))

    def state_of(model: str, segment: str) -> dict | None:
        return {(m, s): st for m, s, st in policy.snapshot()["series"]}.get((model, segment))

    narrator = Narrator(cfg, state_of, engine.samples, engine.now_of)
    interval = cfg.recalibration.interval
    lines: list[str] = []
    drift_events, batch, check = 0, [], START + interval
    for ts, _, _, raw in records:
        while ts >= check:  # the daemon's checks, every interval of event time
            engine.feed(batch)
            batch = []
            series = [(m, s) for m, s, _ in engine.buffered_series()]
            events = policy.check_each(engine.now_of, series, engine.samples)
            drift_events += sum(e.kind == "drift" for e in events)
            lines += narrator.lines(events)
            lines += narrator.open_lines()
            check += interval
        batch.append(raw)
    return lines, narrator.summary(), drift_events


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], int]:
    return _story(tmp_path_factory.mktemp("demo"))


def test_every_drift_ends_in_what_happened(story: tuple[list[str], list[str], int]) -> None:
    lines, summary, drift_events = story
    drifts = [x for x in lines if x.startswith("  >> drift ")]
    assert drifts and len(drifts) < drift_events, (len(drifts), drift_events)  # folded
    for line in drifts:  # each ends with where the series stands
        assert STATES.search(line.split(";", 1)[1]), line
        if "refitted at once" in line:  # and the refit's outcome follows it
            after = lines[lines.index(line) + 1:]
            assert after and ": refit " in after[0], (line, after[:2])
    for line in lines:
        if line.startswith("  .. open: "):
            assert STATES.search(line), line
    # the three models that drift get a published calibrator, fraud's for its segment
    published = [x for x in lines if ": refit published" in x]
    for series in ("ctr/__all__", "triage/__all__", "fraud/country=BR"):
        assert any(x.startswith(f"  >> {series}: refit published: v1 temperature, holdout "
                                "ECE") for x in published), (series, published)
    # what became of every alarm: a publish, the model's calibrator, or a named wait
    assert summary[0] == "what became of each drift alarm:"
    for line in summary[1:]:
        fate = line.split(": ", 1)[1]
        assert fate.startswith(("published v", "served by ")) or STATES.search(fate), line
    assert not any(x.startswith("  search/") for x in summary), summary  # never alarms
    # a model-wide publish closes the alarms of the segments it now serves, saying so
    served = [x for x in summary if ": served by ctr/__all__ v1" in x]
    assert served and any("now served by this calibrator" in x for x in lines)


def test_a_fraud_alarm_on_the_whole_model_says_why_it_waits(
        story: tuple[list[str], list[str], int]) -> None:
    """fraud's prior shift is in one country: its __all__ alarm is not refitted (the
    segment is), which the newcomer saw as a dangling "drift fraud/__all__"."""
    _, summary, _ = story
    fates = {x.split(": ", 1)[0].strip(): x.split(": ", 1)[1] for x in summary[1:]}
    assert fates.get("fraud/country=BR", "").startswith("published v1"), summary
    if "fraud/__all__" in fates:  # alarmed: it says what it waits for
        assert "local to some segments" in fates["fraud/__all__"], fates


def test_a_rejected_refit_says_why_and_what_comes_next(tmp_path: Path) -> None:
    """A drift answered by a rejected refit ends with the gate's reason and when it is
    tried again, and stays open in the summary with what was tried."""
    from calmon.recal.policy import Event

    cfg = demo_config("unused:9092", 0, tmp_path)
    narrator = Narrator(cfg, lambda m, s: None, lambda m, s, w: None, lambda m: START + 30)
    reason = "NLL improvement not significant (log e-value 2.1 < 4.6)"
    lines = narrator.lines([
        Event(START + 20, "ctr", "__all__", "drift", {"trigger": "ece_above",
                                                      "change_ts": START + 12}),
        Event(START + 20, "ctr", "__all__", "rejected", {"method": "temperature",
                                                         "reason": reason})])
    assert lines == [
        "  >> drift ctr/__all__: ece_above, change estimated 8 s earlier; refitted at once "
        "(below)",
        f"  >> ctr/__all__: refit rejected: {reason}; retried when its post-change samples "
        "double or after 6h"]  # recalibration.retry_after's default
    assert narrator.summary()[1] == (
        f"  ctr/__all__: open after rejected ({reason}): refit due at the next check")


def test_a_too_few_samples_rejection_says_a_refit_comes_with_the_samples(
        tmp_path: Path) -> None:
    """The v4 latch let go for want of samples: not "retried when samples double" (there
    was no refit to double), but a refit once min_samples post-change samples are in."""
    from calmon.recal.policy import Event

    cfg = demo_config("unused:9092", 0, tmp_path)
    narrator = Narrator(cfg, lambda m, s: None, lambda m, s, w: None, lambda m: START + 30)
    lines = narrator.lines([
        Event(START + 20, "ctr", "__all__", "rejected", {"method": "temperature",
                                                         "reason": "too_few_samples"})])
    assert lines == [
        "  >> ctr/__all__: refit rejected: too_few_samples; a refit is tried once "
        f"{cfg.recalibration.min_samples} post-change samples have accrued"]
