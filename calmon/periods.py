"""``calmon replay --every DURATION``: one row per model, segment and period of event
time (contract section 3, v5).

Periods are [k D, (k + 1) D), k an integer (so ``1d`` periods start at 00:00 UTC). A
row has two parts, each read the way the daemon reads its windows:

- **realized**: the joined samples whose prediction ts lies in the period, with every
  label joined by the end of the replay. The engine's joined samples are tapped as it
  counts them (``Windows.taps``: scored, fanned out to their series) into a table of
  the same layout whose buckets are the periods; a period's bucket is read and dropped
  once no label can join it any more: when its model's event time is past
  period_end + ``join.ttl`` (or the implicit-negative delay), every prediction of the
  period has joined or expired. So memory holds only the open periods.
- **as of period_end**: the pending predictions, the label-free estimates and the
  score PSI, read from the engine (``pending_counts`` / ``estimates``, the daemon's own
  path) when the replay reaches period_end, before the first record at or after it.
  The replay's engine carries a window of length D for this (added when
  ``metrics.windows`` has none): evaluated just before period_end, its buckets are
  exactly the period's, and the window before it is the previous period (the PSI's
  reference when no calibrator is live).

Rows are computed with the refresher's functions (``metrics.plugin_stats``,
``snapshot.expensive_stats``), so a period's row equals a window row on the same
samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.config import Config, Window
from calmon.engine.engine import Engine
from calmon.engine.estimates import Estimates
from calmon.engine.metrics import plugin_stats
from calmon.engine.rows import Row
from calmon.engine.snapshot import expensive_stats
from calmon.engine.windows import BUCKETS, Samples, Windows
from calmon.timeline import Timeline


@dataclass(frozen=True)
class PeriodRow:
    """One (model, segment, period) row: ``row.window`` is the period's length as given."""

    start: float
    end: float
    row: Row


def with_window(cfg: Config, seconds: float, name: str) -> Config:
    """``cfg`` with a window of ``seconds`` (the one a period's estimates are read in),
    unchanged when it has one already."""
    if any(w.seconds == seconds for w in cfg.metrics.windows):
        return cfg
    windows = (*cfg.metrics.windows, Window(name, seconds))
    return dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, windows=windows))


class Periods:
    """Follows one engine through a replay and hands each (model, segment, period) row
    to ``sink`` once it is final (see the module's docstring)."""

    def __init__(self, engine: Engine, seconds: float, name: str,
                 sink: Callable[[PeriodRow], None],
                 before_end: Callable[[], object] | None = None) -> None:
        cfg = engine.cfg
        self.engine = engine
        self.every = seconds
        self.name = name
        self.sink = sink
        self.before_end = before_end  # e.g. the backtest's live calibrators into the engine
        self.w = next(i for i, w in enumerate(cfg.metrics.windows) if w.seconds == seconds)
        implicit = cfg.join.missing_label
        # a prediction is settled (joined or expired) by ts + this on its model's clock
        self.wait = max(cfg.join.ttl, implicit.after if implicit is not None else 0.0)
        # a bucket per period: width ``seconds``
        self.table = Windows((Window(name, seconds * BUCKETS),), cfg.metrics.bins,
                             cfg.metrics.fine_bins)
        self.ids: dict[tuple[str, str], int] = {}  # (model, segment) -> table series id
        self.names: list[tuple[str, str]] = []
        self.binary: dict[tuple[str, str], bool] = {}
        self.open: dict[str, set[int]] = {}  # model -> its periods not yet final
        self.held: dict[tuple[str, str, int], Estimates] = {}  # as of each period's end
        self.ended = -math.inf  # the last period read as of its end
        engine.windows.taps.append(self._tap)

    # ------------------------------------------------------------ feeding

    def feed(self, line: Timeline, start: int, end: int,
             feed: Callable[[int, int], None]) -> None:
        """Feed records start..end-1 with ``feed``, stopping at each period's end to
        read it as of then, and emit the rows that became final."""
        per = np.floor(line.t[start:end + 1 if end < len(line) else end] / self.every)
        cuts = (np.flatnonzero(per[1:] != per[:-1]) + 1 + start).tolist()
        at = start
        for j in cuts:
            if j > at:
                feed(at, j)
                at = j
            self.period_ended(float(per[j - 1 - start]))
            self.settle()
        if end > at:
            feed(at, end)
            self.settle()

    def finish(self, line: Timeline) -> None:
        """After the last record: the last period as of now, then every open row."""
        finite = line.t[np.isfinite(line.t)]
        if len(finite):
            self.period_ended(math.floor(float(finite[-1]) / self.every))
        self.settle(final=True)

    def _tap(self, s: Samples) -> None:
        """The joined samples as the engine counts them, into their periods."""
        series = self.engine.index.series
        uniq, inv = np.unique(s.sid, return_inverse=True)
        mine = np.array([self._id(*series[i]) for i in uniq.tolist()], np.int64)
        sid = mine[inv.ravel()]
        self.table.add(Samples(sid, s.ts, s.conf, s.correct, s.acc, s.brier, s.nll), s.ts)
        per = np.floor(s.ts / self.every)
        for i, k in set(zip(sid.tolist(), per.tolist())):
            self.open.setdefault(self.names[i][0], set()).add(int(k))

    def _id(self, model: str, segment: str) -> int:
        got = self.ids.get((model, segment))
        if got is None:
            got = self.ids[(model, segment)] = len(self.names)
            self.names.append((model, segment))
        return got

    # ------------------------------------------------------------ as of period_end

    def period_ended(self, k: float) -> None:
        """Read period k's pending predictions and estimates as the daemon would show
        them at its end (the replay has read every record before it, none after)."""
        if not math.isfinite(k) or k <= self.ended:
            return
        self.ended = k
        if self.before_end is not None:
            self.before_end()
        eng = self.engine
        state = eng.read_state(eng.version)
        # just before period_end: the D window's buckets are the period's
        now = (k + 1) * self.every - self.every / BUCKETS / 2
        nows = np.full(len(state.series), now)
        sids = [sid for sid, (m, _) in enumerate(state.series)
                if m and eng.scores.counts(sid, self.w, now).sum() > 0]
        if not sids:
            return
        estimates = eng.estimates(sids, eng.pending_counts(nows), nows)
        for sid in sids:
            model, segment = state.series[sid]
            self._id(model, segment)
            self.binary[(model, segment)] = state.binary[sid]
            self.held[(model, segment, int(k))] = estimates[(sid, self.w)]
            self.open.setdefault(model, set()).add(int(k))

    # ------------------------------------------------------------ final rows

    def settle(self, final: bool = False) -> None:
        """Emit the rows of every period no label can join any more (all with
        ``final``: the replay has ended)."""
        due: list[tuple[str, int]] = []
        for model, ks in self.open.items():
            now = self.engine.now_of(model)
            dropped = not math.isfinite(now)  # the model was dropped, its pending with it
            due += [(model, k) for k in ks
                    if final or dropped or (k + 1) * self.every + self.wait <= now]
        if not due:
            return
        lay = self.table.layout
        out: list[tuple[float, Row, np.ndarray]] = []
        for model, k in sorted(due):
            self.open[model].discard(k)
            if not self.open[model]:
                del self.open[model]
            for sid, (m, segment) in enumerate(self.names):
                if m != model:
                    continue
                vec = self.table.pop(0, sid, k)
                est = self.held.pop((m, segment, k), None)
                if vec is None and est is None:
                    continue
                vec = vec if vec is not None else np.zeros(lay.size)
                binary = self.binary.get((m, segment), True)
                st = plugin_stats(vec, lay, binary, self.engine.cfg.metrics.mce_min_samples)
                out.append((k * self.every, Row(m, segment, self.name, binary, st, None,
                                                est if est is not None else Estimates()), vec))
        self._emit(out)

    def _emit(self, out: list[tuple[float, Row, np.ndarray]]) -> None:
        """The expensive statistics of these rows in one stack, then each to the sink."""
        lay = self.table.layout
        with_samples = [i for i, (_, r, _) in enumerate(out) if r.stats.samples]
        if with_samples:
            values = expensive_stats(np.stack([out[i][2] for i in with_samples]), lay,
                                     self.engine.cfg.metrics.interval_level)
            for i, vals in zip(with_samples, zip(*values)):
                start, row, vec = out[i]
                l2, sm, lo, hi = (float(v) for v in vals)
                st = dataclasses.replace(row.stats, ece_l2_debiased=l2, smece=sm,
                                         ece_lower=lo, ece_upper=hi)
                out[i] = (start, dataclasses.replace(row, stats=st), vec)
        for start, row, _ in out:
            self.sink(PeriodRow(start, start + self.every, row))


def as_json(p: PeriodRow) -> dict[str, Any]:
    """A period's row as ``replay --every --json`` prints it (calibrated_* null: the
    backtest's calibrated ECE is a window's, not a period's)."""
    r = p.row
    return {"model": r.model, "segment": r.segment, "window": r.window,
            "period_start": p.start, "period_end": p.end, **r.stats.as_row(),
            **r.estimates.as_row(), "calibrated_ece": None, "calibrated_samples": None}
