"""``calmon replay``: the same engine over JSONL files instead of Kafka.

Records are read in event time across both files (``calmon.timeline``: each at its
own ``ts``, an untimed one at the same relative place of the other file), in batches
of the daemon's size, with the recalibration checks of ``--recalibrate`` between them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind
from calmon.engine.rows import Snapshot
from calmon.engine.snapshot import full_snapshot
from calmon.periods import PeriodRow, Periods, as_json, with_window
from calmon.timeline import Timeline, read_lines, timeline
from calmon.timeline import order_key as order_key  # re-exported: older imports

if TYPE_CHECKING:
    from calmon.recal.policy import Event

BATCH = 5000
# a plain replay runs no calibrator: its calibrated ECE is null (replay --recalibrate has one)
NO_CALIBRATOR = {"calibrated_ece": None, "calibrated_samples": None}


def read(cfg: Config, predictions: Path, labels: Path) -> Timeline:
    """Both files, read in bulk and ordered in event time (``calmon.timeline``)."""
    return timeline(read_lines(predictions, Kind.PREDICTION, cfg.fields.ts),
                    read_lines(labels, Kind.LABEL, cfg.fields.for_labels().ts))


def _feed(engine: Engine, line: Timeline, start: int, end: int,
          invalid: Counter[tuple[str, str]] | None,
          joined: set[tuple[str, str]] | None = None) -> None:
    """``joined``, when given, gains the series the batch joined samples into."""
    engine.feed(line.batch(start, end))
    if invalid is not None:
        invalid.update(engine.last_delta.invalid)
    if joined is not None:
        joined.update(engine.last_delta.bins)


@dataclass(frozen=True)
class Every:
    """``--every``: the period's length, as given and in seconds, and where its rows go."""

    name: str
    seconds: float
    sink: Callable[[PeriodRow], None]


def _periods(engine: Engine, every: Every | None,
             before_end: Callable[[], object] | None = None) -> Periods | None:
    return None if every is None else Periods(engine, every.seconds, every.name, every.sink,
                                              before_end)


def _feed_all(engine: Engine, line: Timeline, start: int, end: int,
              invalid: Counter[tuple[str, str]] | None, periods: Periods | None,
              joined: set[tuple[str, str]] | None = None) -> None:
    """Records start..end-1; with ``--every``, stopping at each period's end."""
    if periods is None:
        _feed(engine, line, start, end, invalid, joined)
    else:
        periods.feed(line, start, end,
                     lambda a, b: _feed(engine, line, a, b, invalid, joined))


def run(cfg: Config, predictions: Path, labels: Path, *,
        invalid: Counter[tuple[str, str]] | None = None, every: Every | None = None) -> Engine:
    """Feed both files through a fresh engine and return it. ``invalid``, when given,
    receives the count of rejected records by (topic, reason); ``every``: the rows by
    period go to its sink (``calmon.periods``)."""
    engine = Engine(cfg if every is None else with_window(cfg, every.seconds, every.name))
    periods = _periods(engine, every)
    line = read(cfg, predictions, labels)
    for i in range(0, len(line), BATCH):
        _feed_all(engine, line, i, min(i + BATCH, len(line)), invalid, periods)
    if periods is not None:
        periods.finish(line)
    return engine


def replay(cfg: Config, predictions: Path, labels: Path, *,
           invalid: Counter[tuple[str, str]] | None = None) -> Snapshot:
    """Feed both files through a fresh engine; return its final statistics."""
    return final(run(cfg, predictions, labels, invalid=invalid))


def invalid_reasons(invalid: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{topic: {reason: n}}, as ``replay --json`` prints it."""
    out: dict[str, dict[str, int]] = {}
    for (topic, reason), n in sorted(invalid.items()):
        out.setdefault(topic, {})[reason] = n
    return out


def final(engine: Engine) -> Snapshot:
    """Every statistic at the end, fresh (no refresh age), with the daemon's functions."""
    return full_snapshot(engine)


@dataclass
class Backtest:
    view: Snapshot
    events: list[Event]
    calibrated: list[tuple[str, str, str, float | None, int]]
    engine: Engine | None = None
    # (model, segment) -> (apply(scores, kinds), fitted_at event time) live at the end
    calibrators: dict[tuple[str, str], tuple[Any, float | None]] = dataclasses.field(
        default_factory=dict)


def _schedule(t: np.ndarray, interval: float) -> Iterator[tuple[int, int, int]]:
    """(start, end, checks): feed records start..end-1, then run that many checks.

    Checks fall on multiples of ``interval``: a check at time c sees every record read
    before c. Batches hold at most BATCH records and end at each check; an idle stretch
    is skipped in one step (nothing changes between empty checks except cooldowns,
    which the next check with data sees anyway). The records after the last check
    (untimed ones included) come last."""
    n = len(t)
    finite = int(np.searchsorted(t, math.inf, side="left"))  # t is ascending, inf last
    start = 0
    if finite:
        next_check = (math.floor(t[0] / interval) + 1) * interval
        while True:
            j = int(np.searchsorted(t[:finite], next_check, side="left"))
            while j - start >= BATCH:  # full batches before the check
                yield start, start + BATCH, 0
                start += BATCH
            if j >= finite:
                break
            ts = float(t[j])
            checks = 0
            while ts >= next_check:  # one batch, then each check record j brings due
                checks += 1
                next_check = max(next_check + interval, math.floor(ts / interval) * interval)
            yield start, j, 1
            for _ in range(checks - 1):
                yield j, j, 1
            start = j
    while n - start >= BATCH:
        yield start, start + BATCH, 0
        start += BATCH
    yield start, n, 0  # the rest (perhaps nothing), then the last check


def replay_recalibrate(cfg: Config, predictions: Path, labels: Path,
                       output_dir: Path | None = None, *,
                       invalid: Counter[tuple[str, str]] | None = None,
                       every: Every | None = None) -> Backtest:
    """The recalibration backtest: the daemon's policy (calmon.recal.policy) checked
    every ``recalibration.interval`` of event time while the files are fed in timestamp
    order. Checks fall on multiples of the interval: a check at time t sees every record
    with ts < t, and its clock is "now" as in the engine (the largest prediction ts
    seen), exactly as the daemon's job reads it. Published calibrators go to
    ``output_dir`` (memory when None) and apply to everything the policy scores after
    them, as they would live. ``every``: rows by period too, each estimated through
    the calibrators live at its end."""
    from calmon.calibrators.signing import Signer
    from calmon.recal.live import LiveSet, read_live, regime_starts
    from calmon.recal.newer import newer_scores
    from calmon.recal.policy import Policy, parse_iso
    from calmon.recal.registry import Registry

    if not cfg.recalibration.enabled:
        cfg = dataclasses.replace(cfg, recalibration=dataclasses.replace(
            cfg.recalibration, enabled=True))
    engine = Engine(cfg if every is None else with_window(cfg, every.seconds, every.name))
    policy = Policy(cfg, Registry(output_dir, signer=Signer.from_config(cfg.calibrators)))
    policy.scores_of = partial(newer_scores, engine)  # held refits read the newer predictions
    policy.readers_each_check = False  # published when read (live_now)
    interval = cfg.recalibration.interval
    events: list[Event] = []

    listed: list[tuple[int, list[tuple[str, str]]]] = []  # (generation, the series)

    def series() -> list[tuple[str, str]]:
        """The buffered series, listed again only when a buffer was made or dropped."""
        gen = engine.buffered_generation()
        if not listed or listed[0][0] != gen:
            listed[:] = [(gen, [(m, s) for m, s, _ in engine.buffered_series()])]
        return listed[0][1]

    def live_now() -> LiveSet:
        """What a period's (or the end's) estimates read: the calibrators live now, and
        each series' current regime for its estimation map, as the daemon's do."""
        policy.publish_readers()
        live = read_live(policy.registry)
        engine.set_calibrators({k: (v[0], v[1]) for k, v in live.served.items()})
        engine.set_changes(regime_starts(live.changes, policy.gauges.change_ts))
        return live

    periods = _periods(engine, every, live_now)
    line = read(cfg, predictions, labels)
    # the series the feeds since the last check joined samples into: a check passes
    # over the others unread when they are idle (calmon.recal.skip.Untouched)
    new: set[tuple[str, str]] = set()

    def check() -> list[Event]:
        got = policy.check_each(engine.now_of, series(), engine.samples, new=new)
        new.clear()
        return got

    for start, end, checks in _schedule(line.t, interval):
        _feed_all(engine, line, start, end, invalid, periods, new)
        for _ in range(checks):
            events += check()
    if math.isfinite(engine.now):  # one last check
        events += check()
    if periods is not None:
        periods.finish(line)
    now = engine.now
    calibrated = (policy.calibrated(engine.now_of, series(), engine.samples)
                  if math.isfinite(now) else [])
    live = live_now()  # the label-free estimates and score PSI of the rows
    cals: dict[tuple[str, str], tuple[Any, float | None]] = {}
    for (m, s), (apply, _, _) in live.served.items():
        doc = policy.registry.live(m, s)
        cals[(m, s)] = (apply, None if doc is None else parse_iso(doc.doc.get("fitted_at")))
    return Backtest(final(engine), events, calibrated, engine, cals)


def to_json(view: Snapshot, classwise: bool = False,
            backtest: Backtest | None = None) -> dict[str, Any]:
    rows = [{"model": r.model, "segment": r.segment, "window": r.window, **r.stats.as_row(),
             **r.estimates.as_row(), **NO_CALIBRATOR,
             **({"classwise_ece": r.classwise_ece} if classwise else {})}
            for r in view.rows]
    counters = {k: view.counters.get(k, 0) for k in
                ("predictions", "labels", "joined", "invalid", "expired", "duplicates")}
    out: dict[str, Any] = {"rows": rows, "counters": counters}
    if backtest is not None:
        # after the calibrator live at the end, on samples predicted after its fit only;
        # a series without one: the raw window (nothing to recalibrate)
        cal: dict[tuple[str, str, str], tuple[float | None, int]] = {
            (m, s, w): (v, n) for m, s, w, v, n in backtest.calibrated}
        for row in rows:
            got = cal.get((str(row["model"]), str(row["segment"]), str(row["window"])))
            row["calibrated_ece"], row["calibrated_samples"] = (
                got if got is not None else (row["ece"], row["samples"]))
        out["events"] = [_plain(e.as_dict()) for e in backtest.events]
    return out


def periods_json(rows: list[PeriodRow], view: Snapshot,
                 backtest: Backtest | None = None) -> dict[str, Any]:
    """``--every --json``: the rows by period (model, segment, then period), the
    counters, and a backtest's events."""
    out = to_json(Snapshot(view.now, [], view.counters, view.pending, view.pending_labels,
                           view.series, view.version), False, backtest)
    out["rows"] = [as_json(p) for p in sorted(
        rows, key=lambda p: (p.row.model, p.row.segment, p.start))]
    return out


def _plain(value: Any) -> Any:
    """JSON-able and finite (events are printed with allow_nan=False)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_COLUMNS = [("samples", "samples"), ("ece", "ece"), ("mce", "mce"), ("ace", "ace"),
            ("brier", "brier"), ("nll", "nll"), ("acc", "accuracy"),
            ("conf", "mean_confidence"), ("obs", "observed_rate"),
            ("obs/exp", "observed_over_expected"), ("floor", "noise_floor"),
            ("ece_lo", "ece_lower"), ("ece_hi", "ece_upper"), ("l2_deb", "ece_l2_debiased"),
            ("smece", "smece"), ("pending", "pending_samples"),
            ("est_acc", "estimated_accuracy"), ("est_pos", "estimated_positive_rate"),
            ("psi", "score_psi")]


def print_table(view: Snapshot, out: TextIO) -> None:
    cols = [("model", "model"), ("segment", "segment"), ("window", "window"), *_COLUMNS]
    rows = [{"model": r.model, "segment": r.segment, "window": r.window, **r.stats.as_row(),
             **r.estimates.as_row()} for r in view.rows]
    _print_rows(cols, rows, view.counters, out)


def print_periods(rows: list[PeriodRow], counters: dict[str, int], out: TextIO) -> None:
    """``--every``: one line per model, segment and period (its start, UTC)."""
    cols = [("model", "model"), ("segment", "segment"), ("period", "period"), *_COLUMNS]
    table = [{"model": p.row.model, "segment": p.row.segment,
              "period": datetime.fromtimestamp(p.start, UTC).strftime("%Y-%m-%dT%H:%MZ"),
              **p.row.stats.as_row(), **p.row.estimates.as_row()} for p in rows]
    _print_rows(cols, table, counters, out)


def _print_rows(cols: list[tuple[str, str]], rows: list[dict[str, Any]],
                counters: dict[str, int], out: TextIO) -> None:
    table = [[h for h, _ in cols]]
    for row in rows:
        table.append([_fmt(row[k]) for _, k in cols])
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    for line in table:
        out.write("  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(line, widths))).rstrip() + "\n")
    c = counters
    out.write("\n" + "  ".join(f"{k}={c.get(k, 0)}" for k in
                               ("predictions", "labels", "joined", "invalid", "expired",
                                "duplicates")) + "\n")


def print_events(events: list[Event], out: TextIO) -> None:
    """One line per recalibration event, in event-time order."""
    if not events:
        out.write("\nno recalibration events\n")
        return
    out.write("\nevents:\n")
    for e in events:
        f = e.fields
        when = datetime.fromtimestamp(e.ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if e.kind == "drift":
            ch = f.get("change_ts")
            since = "" if ch is None else " since " + datetime.fromtimestamp(
                ch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            detail = f"trigger {f.get('trigger')}{since}"
        else:
            b, a = f.get("holdout_before") or {}, f.get("holdout_after") or {}
            detail = f"{f.get('method')}"
            if "version" in f:
                detail += f" v{f['version']}"
            if b and a:
                detail += (f" holdout ECE {b['ece']:.4f} -> {a['ece']:.4f},"
                           f" NLL {b['nll']:.4f} -> {a['nll']:.4f}")
            if f.get("reason"):
                detail += f" ({f['reason']})"
        out.write(f"{when}  {e.model}  {e.segment}  {e.kind:<9} {detail}\n")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)
