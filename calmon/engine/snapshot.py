"""Statistics as a read model: what /metrics, /reliability and /status render.

The loop thread feeds the engine; a ``Refresher`` turns what changed into an
immutable ``Snapshot`` of rows, off the request path (the daemon's loop calls
``update`` between batches, within a share of its time; ``replay`` calls it once
with ``full``):

- the plug-in numbers (counts, ECE, MCE, ACE, Brier, NLL, ..., the noise floor)
  of every (series, window) whose counts changed are recomputed at each update,
  so they are current to the last batch the update saw;
- the expensive ones (the debiased and smooth ECE, the ECE interval, the
  label-free estimates and PSI) are refreshed in rounds every ``metrics.refresh``,
  only for rows whose counts changed since their last refresh, a slice of rows per
  update and vectorised across the slice (``calmon.engine.stats``), so a round over
  a fleet never holds the engine for long; ``Snapshot.age`` says how old the
  ones being served are.

A row whose counts did not change keeps its ``Row`` object, so an update costs in
proportion to what changed. Nothing here has a thread or a clock of its own: the
caller passes the wall clock.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from calmon.engine import stats
from calmon.engine.estimates import Estimates
from calmon.engine.metrics import plugin_stats
from calmon.engine.reading import Reads, ReadState, WindowSums
from calmon.engine.rows import Row, Snapshot, empty
from calmon.engine.windows import CONF_SCALE, Layout

log = logging.getLogger(__name__)

SLICE_ROWS = 64  # rows whose expensive statistics one update computes (one stack)
LOCK_SERIES = 64  # series whose window sums are read per hold of the engine lock


@dataclass
class _Cached:
    row: Row
    cur: int  # the window's newest bucket when its sums were read
    digest: bytes  # of the sums the plug-in numbers came from
    exp_digest: bytes | None = None  # of the sums the expensive numbers came from
    expensive: tuple[float, float, float, float] | None = None  # l2, smece, lower, upper


@dataclass
class _Work:
    """What one update read of the engine: its state, and the rows it shows."""

    state: ReadState
    shown: list[int]
    sums: dict[tuple[int, int], WindowSums] = field(default_factory=dict)

    @property
    def nows(self) -> np.ndarray:
        return self.state.nows

    @property
    def windows(self) -> int:
        return self.state.windows


class Refresher:
    """Builds snapshots of one engine. One thread calls ``update`` (it reads the engine
    under its lock, in short holds); any thread may read ``latest``."""

    def __init__(self, engine: Reads, *, clock: Callable[[], float] = time.time,
                 slice_rows: int = SLICE_ROWS) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.clock = clock
        self.slice_rows = slice_rows
        self._cache: dict[tuple[int, int], _Cached] = {}
        self._estimates: dict[tuple[int, int], Estimates] = {}
        self._pending_sids: set[int] = set()
        self._queue: list[tuple[int, int]] = []  # the round's rows still to refresh
        self._round_started: float | None = None
        self._refreshed_at: float | None = None  # start of the last completed round
        self._round_version = -1  # the engine version the last round started at
        self._read_version = -1  # the engine version the last update read
        self._started = clock()
        self._serial = 0
        self.latest: Snapshot = empty(self._started)
        self._forgotten = engine.forgotten_cursor()
        self.errors = 0  # series skipped because computing them raised (counted)
        self._logged: set[tuple[str, str]] = set()  # each series' first raise is logged

    # ------------------------------------------------------------ one update

    def due(self) -> bool:
        """Whether the expensive statistics are due (a round in progress, or
        ``metrics.refresh`` since the last round started)."""
        if self._round_started is not None:
            return True
        last = self._refreshed_at if self._refreshed_at is not None else -math.inf
        return self.clock() - last >= self.cfg.metrics.refresh

    def update(self, *, full: bool = False) -> Snapshot:
        """Bring the plug-in numbers up to date and, when due, refresh a slice of the
        expensive ones (``full``: all of them, now). Returns the new ``latest``."""
        version = self.engine.version
        # a round when due, unless nothing changed since the last one started
        expensive = full or self._round_started is not None or (
            self.due() and version != self._round_version)
        if not expensive and version == self._read_version:
            return self.latest
        self._forget()
        work = self._read_state()
        dirty = self._dirty(work)
        self._read_sums(work, dirty)
        self._plugin(work, dirty)
        if expensive:
            if self._round_started is None or full:
                self._start_round(work)
            self._expensive(None if full else self.slice_rows)
            if not self._queue:
                self._refreshed_at = self._round_started
                self._round_started = None
        return self._publish(work)

    def _forget(self) -> None:
        """What the engine forgot (a model dropped, a class count reset) goes from the
        rows kept here at once, whatever their sums."""
        gone = self._forgotten.take()
        if gone is None:  # first read, or the engine was restored: nothing kept holds
            self._cache, self._estimates, self._pending_sids = {}, {}, set()
            return
        models = {m for m, _ in gone}
        if models:  # their series ids may be another model's by now
            sids = {k[0] for k, c in self._cache.items() if c.row.model in models}
            self._cache = {k: c for k, c in self._cache.items() if k[0] not in sids}
            self._estimates = {k: e for k, e in self._estimates.items() if k[0] not in sids}
            self._pending_sids -= sids
            self._logged = {k for k in self._logged if k[0] not in models}

    def _failed(self, model: str, segment: str, what: str) -> None:
        """One series' statistics raised: counted, logged once per series, skipped."""
        self.errors += 1
        if (model, segment) not in self._logged:
            self._logged.add((model, segment))
            log.exception("%s of %r/%r raised; skipped (logged once, counted in "
                          "calmon_series_errors_total)", what, model, segment)

    def _read_state(self) -> _Work:
        state = self.engine.read_state(self._read_version)
        self._read_version = state.version
        series = state.series
        shown = sorted((s for s in state.with_data | self._pending_sids
                        if s < len(series) and series[s][0]), key=lambda s: series[s])
        return _Work(state, shown)

    @staticmethod
    def _cur(work: _Work, sid: int, w: int) -> int:
        return int(work.state.current[w, sid])

    def _dirty(self, work: _Work) -> list[tuple[int, int]]:
        out = []
        changed = work.state.changed
        for sid in work.shown:
            hit = changed is None or sid in changed
            for w in range(work.windows):
                c = self._cache.get((sid, w))
                if hit or c is None or c.cur != self._cur(work, sid, w):
                    out.append((sid, w))
        return out

    def _read_sums(self, work: _Work, rows: list[tuple[int, int]]) -> None:
        """The window sums (and classwise ECE) of these rows, a few series per hold of
        the engine lock so the loop thread is never kept waiting long."""
        step = LOCK_SERIES * work.windows
        for i in range(0, len(rows), step):
            part = rows[i:i + step]
            work.sums.update(zip(part, self.engine.window_sums(part, work.nows)))

    def _plugin(self, work: _Work, rows: list[tuple[int, int]]) -> None:
        for sid, w in rows:
            try:
                self._plugin_row(work, sid, w)
            except Exception:  # one series' trouble never stops the others' numbers
                self._cache.pop((sid, w), None)
                self._failed(*work.state.series[sid], "the statistics")

    def _plugin_row(self, work: _Work, sid: int, w: int) -> None:
        m = self.cfg.metrics
        lay = self.engine.layout
        binary = work.state.binary
        sums = work.sums[(sid, w)]
        vec = sums.vec if sums.vec is not None else np.zeros(lay.size)
        cw, worst = sums.classwise_ece, sums.worst_class
        digest = _digest(vec)
        old = self._cache.get((sid, w))
        model, segment = work.state.series[sid]
        est = self._estimates.get((sid, w), Estimates())
        if old is not None and old.digest == digest and old.row.classwise_ece == cw:
            old.cur = self._cur(work, sid, w)
            return
        st = plugin_stats(vec, lay, binary[sid], m.mce_min_samples)
        c = _Cached(Row(model, segment, m.windows[w].name, binary[sid], st, cw, est,
                        worst), self._cur(work, sid, w), digest)
        if old is not None:
            c.exp_digest, c.expensive = old.exp_digest, old.expensive
        c.row = self._row(c)
        self._cache[(sid, w)] = c

    def _row(self, c: _Cached) -> Row:
        st = c.row.stats
        if st.samples and c.expensive is not None:
            l2, sm, lo, hi = c.expensive
            st = replace(st, ece_l2_debiased=l2, smece=sm, ece_lower=lo, ece_upper=hi)
        elif not st.samples and st.ece_lower is not None:
            st = replace(st, ece_l2_debiased=None, smece=None, ece_lower=None, ece_upper=None)
        return replace(c.row, stats=st) if st is not c.row.stats else c.row

    def _start_round(self, work: _Work) -> None:
        """A new round: the label-free estimates of every row (one pass over the pending
        predictions), and the queue of rows whose counts changed since their refresh."""
        self._round_started = self.clock()
        self._round_version = work.state.version
        eng = self.engine
        try:
            pending = eng.pending_counts(work.nows)
        except Exception:  # the estimates go without the pending predictions this round
            self._failed("", "", "the pending predictions' estimates")
            pending = {}
        self._pending_sids = {s for s, _ in pending}
        estimates: dict[tuple[int, int], Estimates] = {}
        shown = work.shown
        for i in range(0, len(shown), LOCK_SERIES):
            part = shown[i:i + LOCK_SERIES]
            try:
                estimates.update(eng.estimates(part, pending, work.nows))
            except Exception:  # the slice again, one series at a time
                for sid in part:
                    try:
                        estimates.update(eng.estimates([sid], pending, work.nows))
                    except Exception:
                        self._failed(*work.state.series[sid], "the estimates")
        self._estimates = estimates
        for key, c in self._cache.items():
            est = estimates.get(key, Estimates())
            if c.row.estimates != est:
                c.row = replace(c.row, estimates=est)
        self._queue = [key for key, c in self._cache.items()
                       if c.row.stats.samples and c.exp_digest != c.digest]

    def _expensive(self, limit: int | None) -> None:
        """The debiased and smooth ECE and the ECE interval of the next rows of the
        round, from their sums as they are now, one stack."""
        take = self._queue if limit is None else self._queue[:limit]
        self._queue = [] if limit is None else self._queue[limit:]
        take = [k for k in take if k in self._cache]
        if not take:
            return
        lay = self.engine.layout
        vecs: list[np.ndarray] = []
        keys: list[tuple[int, int]] = []
        for i in range(0, len(take), LOCK_SERIES):
            part = take[i:i + LOCK_SERIES]
            for key, sums in zip(part, self.engine.window_sums(part, classwise=False)):
                vec = sums.vec
                if vec is not None and vec[lay.count:lay.count + lay.bins].sum() > 0:
                    vecs.append(vec)
                    keys.append(key)
        if not vecs:
            return
        for key, vec, vals in self._stacked(keys, vecs):
            c = self._cache[key]
            c.exp_digest = _digest(vec)
            c.expensive = tuple(float(v) for v in vals)  # type: ignore[assignment]
            c.row = self._row(c)

    def _stacked(self, keys: list[tuple[int, int]], vecs: list[np.ndarray]
                 ) -> list[tuple[tuple[int, int], np.ndarray, tuple[Any, ...]]]:
        """The expensive statistics of these rows in one stack; when the stack raises,
        row by row, skipping (and counting) the rows that raise alone."""
        level = self.cfg.metrics.interval_level
        lay = self.engine.layout
        try:
            return list(zip(keys, vecs, zip(*expensive_stats(np.stack(vecs), lay, level))))
        except Exception:
            out = []
            for key, vec in zip(keys, vecs):
                try:
                    out += list(zip([key], [vec], zip(*expensive_stats(vec[None], lay, level))))
                except Exception:
                    c = self._cache[key]
                    self._failed(c.row.model, c.row.segment, "the expensive statistics")
            return out

    def _publish(self, work: _Work) -> Snapshot:
        rows = []
        keep = set()
        stale = False
        for sid in work.shown:
            for w in range(work.windows):
                c = self._cache.get((sid, w))
                if c is None:  # computing it raised: skipped (counted)
                    continue
                keep.add((sid, w))
                rows.append(c.row)
                stale = stale or bool(c.row.stats.samples and c.exp_digest != c.digest)
        for key in [k for k in self._cache if k not in keep]:  # series gone from the windows
            del self._cache[key]
        since = None
        if stale:
            since = self._refreshed_at if self._refreshed_at is not None else self._started
        self._serial += 1
        st = work.state
        self.latest = Snapshot(st.now, rows, dict(st.counters), st.pending, st.pending_labels,
                               list(st.series), st.version,
                               series_held=sum(1 for m, _ in st.series if m),
                               built_at=self.clock(), stale_since=since, serial=self._serial,
                               series_errors=self.errors)
        return self.latest


def full_snapshot(engine: Reads) -> Snapshot:
    """Every statistic of the engine's state now, the expensive ones included: what a
    reader with no refresher of its own renders (``replay``, its report, a test)."""
    return Refresher(engine).update(full=True)


def expensive_stats(vecs: np.ndarray, lay: Layout, level: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(debiased l2, smooth ECE, ECE lower, ECE upper) of each row of stacked window sums
    (see ``windows.Layout``), as ``metrics.from_vector`` computes them one by one."""
    b, f = lay.bins, lay.fine_bins
    count = vecs[:, lay.count:lay.count + b]
    conf = vecs[:, lay.conf:lay.conf + b] / CONF_SCALE
    correct = vecs[:, lay.correct:lay.correct + b]
    fcount = vecs[:, lay.fcount:lay.fcount + f]
    fconf = vecs[:, lay.fconf:lay.fconf + f] / CONF_SCALE
    fcorrect = vecs[:, lay.fcorrect:lay.fcorrect + f]
    l2 = stats.ece_l2_debiased_batch(count, conf, correct)
    smooth = stats.smece_batch(fcount, fconf, fcorrect)
    lower, upper = stats.ece_interval_batch(count, conf, correct, level)
    return l2, smooth, lower, upper


def _digest(vec: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(vec).tobytes(), digest_size=16).digest()
