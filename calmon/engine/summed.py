"""Several engines read as one (group mode, contract §8: "Exported series sum the
partitions an instance owns"). Each task (an input partition) has its own ``Engine``;
``SummedEngine`` answers the read interface ``snapshot.Refresher`` builds its snapshots
from (``reading.Reads``) as ONE engine fed every task's records would, so group mode
exports every statistic through the same ``Refresher`` as a single instance:

- series are unified by (model, segment) across the engines, each engine's own series
  ids mapped to the ids kept here;
- a model's windows slide on its latest event time over all the tasks;
- window vectors, classwise vectors, score histograms and pending predictions' sums
  are summed: binned counts and fixed-point sums add exactly, and the pending
  predictions' fine bins are merged by index (``estimating.merged``);
- the estimation maps are fitted here (``estimating.Maps``), on the fine-bin counts of
  the newest buckets summed over the tasks, not per task.

What one engine fed everything would do differently (the tasks' own state, not this
reading): a partition's join (TTL, ``join.max_pending``, implicit negatives) runs on
its task's clock and bounds; segment values past ``segments.max_values`` fold per task,
in the order that task met them; an idle model is dropped per task. And the estimation
maps kept after the labels pause (basis ``last``) live in this process only: a new
member (or a restart) has none until a map is fitted again.

One thread feeds the engines and one reader (a ``Refresher``) reads them through this
object, both on group mode's loop thread: the ids kept here are those of the last
``read_state``, and an id freed there is given to another series only at a later one,
once the reader has dropped its rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from calmon.config import Config
from calmon.engine.engine import COUNTER_KEYS, Engine
from calmon.engine.estimates import Estimates
from calmon.engine.estimating import Live, Maps, Pending, PendingCounts, merged, series_estimates
from calmon.engine.forgotten import Cursor, Journal, Taking
from calmon.engine.reading import ReadState, WindowSums, classwise_of
from calmon.engine.windows import Layout, Windows

HISTORY = 16  # versions whose engine versions are kept, for ``changed``


@dataclass(frozen=True)
class _Part:
    """One engine as of the last ``read_state``: its series ids mapped to ours."""

    engine: Engine
    ours: np.ndarray  # engine series id -> our id (-1: a free series)
    theirs: dict[int, int]  # our id -> the engine's


class SummedEngine:
    """The engines ``engines()`` returns, read as one (see the module)."""

    def __init__(self, cfg: Config, engines: Callable[[], Sequence[Engine]]) -> None:
        self.cfg = cfg
        self.engines = engines
        m = cfg.metrics
        self._windows = Windows(m.windows, m.bins, m.fine_bins)  # its clock and layout only
        self._class_layout = Layout(m.bins, 1)  # as ``EngineState.classwise``'s
        self.maps = Maps(cfg.estimates, self)  # fitted on the summed buckets
        self._ids: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []  # our id -> (model, segment); ("", "") free
        self._free: list[int] = []  # ids free since before the last read: reused first
        self._binary: list[bool] = []
        self._parts: list[_Part] = []
        self._nows = np.zeros(0)
        self._version = 0
        self._seen: tuple[tuple[Engine, int], ...] = ()
        self._history: dict[int, tuple[tuple[Engine, int], ...]] = {0: ()}
        self._journal = Journal()  # what the engines forgot
        self._following: list[tuple[Engine, Cursor]] = []

    # ------------------------------------------------------------ Reads

    @property
    def version(self) -> int:
        """Changes whenever an engine's does, or the set of engines does."""
        seen = tuple((e, e.version) for e in self.engines())
        if len(seen) != len(self._seen) or any(
                a is not c or v != u for (a, v), (c, u) in zip(seen, self._seen)):
            self._version += 1
            self._seen = seen
            self._history[self._version] = seen
            self._history.pop(self._version - HISTORY, None)
        return self._version

    @property
    def layout(self) -> Layout:
        return self._windows.layout

    @property
    def widths(self) -> Sequence[float]:
        return self._windows.widths

    def forgotten_cursor(self) -> Taking:
        return _Following(self, self._journal.cursor())

    def follow(self) -> None:
        """What the engines forgot (a model dropped as idle, a class count reset), into
        our journal. Engines that come or go, or one restored whole, forget nothing
        here: our ids name (model, segment) whatever engine holds them, and the next
        ``read_state`` says every series may have changed, so a reader keeps its rows
        (their expensive statistics too, until its next round: a rebalance does not
        empty the families)."""
        engines = list(self.engines())
        if len(self._following) != len(engines) or any(
                a is not b for (a, _), b in zip(self._following, engines)):
            self._following = [(e, e.forgotten_cursor()) for e in engines]
            for _, cursor in self._following:
                cursor.take()  # the first take re-syncs: from now on
            return
        for _, cursor in self._following:
            for model, why in cursor.take() or ():
                self._journal.add(model, why)

    def read_state(self, since: int) -> ReadState:
        version = self.version
        then = self._history.get(since)
        # an engine come or gone since then changes any series: all may have changed
        same = then is not None and len(then) == len(self._seen) and all(
            a is b for (a, _), (b, _) in zip(then, self._seen))
        before = {id(e): v for e, v in then or ()}
        states = [(e, e.read_state(before.get(id(e), -1))) for e, _ in self._seen]
        self._assign({n for _, st in states for n in st.series if n[0]})
        n = len(self._names)
        model_now: dict[str, float] = {}
        binary = [True] * n
        with_data: set[int] = set()
        changed: set[int] | None = set() if same else None
        self._parts = []
        for engine, st in states:
            ours = np.array([self._ids.get(s, -1) if s[0] else -1 for s in st.series], np.int64)
            self._parts.append(_Part(engine, ours, {int(f): e for e, f in enumerate(ours.tolist())
                                                    if f >= 0}))
            for e, f in enumerate(ours.tolist()):
                if f >= 0:
                    model = st.series[e][0]
                    model_now[model] = max(model_now.get(model, -math.inf), float(st.nows[e]))
                    binary[f] = st.binary[e]
            with_data.update(int(ours[e]) for e in st.with_data if ours[e] >= 0)
            if changed is not None and st.changed is not None:
                changed.update(int(ours[e]) for e in st.changed if e < len(ours) and ours[e] >= 0)
            else:
                changed = None
        self._binary = binary
        nows = np.array([model_now.get(m, -math.inf) if m else -math.inf
                         for m, _ in self._names], np.float64)
        nows.flags.writeable = False
        self._nows = nows
        w_ = self._windows
        current = (np.stack([w_.current(w, nows) for w in range(len(w_.widths))]) if n
                   else np.zeros((len(w_.widths), 0), np.int64))
        current.flags.writeable = False
        counters = dict.fromkeys(COUNTER_KEYS, 0)
        for _, st in states:
            for k, v in st.counters.items():
                counters[k] = counters.get(k, 0) + v
        return ReadState(version, max((st.now for _, st in states), default=-math.inf),
                         MappingProxyType(counters), sum(st.pending for _, st in states),
                         sum(st.pending_labels for _, st in states), tuple(self._names),
                         frozenset(with_data), tuple(binary), nows, current,
                         None if changed is None else frozenset(changed))

    def _assign(self, held: set[tuple[str, str]]) -> None:
        """Our ids of the series some engine holds. An id freed now is reused only from
        the next read on: a reader drops the rows of an id gone from ``series`` first."""
        freed = [i for key, i in self._ids.items() if key not in held]
        for i in freed:
            del self._ids[self._names[i]]
            self._names[i] = ("", "")
        self._free.sort(reverse=True)
        for key in sorted(held - self._ids.keys()):
            if self._free:
                i = self._free.pop()
                self._names[i] = key
            else:
                i = len(self._names)
                self._names.append(key)
            self._ids[key] = i
        self._free += freed

    def window_sums(self, keys: Sequence[tuple[int, int]], nows: np.ndarray | None = None,
                    *, classwise: bool = True) -> tuple[WindowSums, ...]:
        nows = self._nows if nows is None else nows
        vecs: list[np.ndarray | None] = [None] * len(keys)
        for _, rows, got in self._each(keys, nows, classwise=False):
            for i, ws in zip(rows, got):
                vecs[i] = _add(vecs[i], ws.vec)
        cw_rows = [i for i, (sid, _) in enumerate(keys)
                   if classwise and self.cfg.metrics.classwise and not self._binary[sid]
                   and (v := vecs[i]) is not None and v[:self.layout.bins].sum() > 0]
        classes: dict[int, list[np.ndarray | None]] = {i: [] for i in cw_rows}
        for part, rows, enows in self._mapped([keys[i] for i in cw_rows], nows):
            ekeys = [(part.theirs[keys[cw_rows[i]][0]], keys[cw_rows[i]][1]) for i in rows]
            for i, per_class in zip(rows, part.engine.class_sums(ekeys, enows)):
                have = classes[cw_rows[i]]
                have += [None] * (len(per_class) - len(have))
                for c, vec in enumerate(per_class):
                    have[c] = _add(have[c], vec)
        out = []
        for i, vec in enumerate(vecs):
            if vec is not None:
                vec.flags.writeable = False
            cw, worst = (classwise_of(classes[i], self._class_layout) if i in classes
                         else (None, None))
            out.append(WindowSums(vec, cw, worst))
        return tuple(out)

    def pending_counts(self, nows: np.ndarray) -> PendingCounts:
        self.maps.new_round()
        parts: dict[tuple[int, int], list[Pending]] = {}
        for part in self._parts:
            enows = self._engine_nows(part, nows)
            for (e, w), pending in part.engine.pending_counts(enows).items():
                if e < len(part.ours) and part.ours[e] >= 0:
                    parts.setdefault((int(part.ours[e]), w), []).append(pending)
        return MappingProxyType({k: merged(v) for k, v in parts.items()})

    def estimates(self, sids: Sequence[int], pending: PendingCounts,
                  nows: np.ndarray) -> Mapping[tuple[int, int], Estimates]:
        return MappingProxyType(series_estimates(
            self, sids, pending, nows, len(self.widths),
            self.cfg.estimates.calibration == "labelled", self.cfg.metrics.interval_level))

    # ------------------------------------------------------------ estimating.Source

    @property
    def changes(self) -> Mapping[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for part in self._parts:
            out.update(part.engine.changes)
        return out

    def series_name(self, sid: int) -> tuple[str, str]:
        return self._names[sid]

    def find(self, model: str, segment: str) -> int | None:
        return self._ids.get((model, segment))

    def is_binary(self, sid: int) -> bool:
        return self._binary[sid]

    def class_count(self, model: str) -> int:
        return max((p.engine.class_count(model) for p in self._parts), default=-1)

    def calibrator_of(self, model: str, segment: str) -> Live | None:
        for part in self._parts:
            live = part.engine.calibrator_of(model, segment)
            if live is not None:
                return live
        return None

    def score_counts(self, sid: int, w: int, now: float, previous: bool) -> np.ndarray:
        out = np.zeros(self.cfg.metrics.bins, np.int64)
        for part in self._parts:
            e = part.theirs.get(sid)
            if e is not None:
                out += part.engine.score_counts(e, w, now, previous)
        return out

    # ------------------------------------------------------------ estimating.Buckets

    def bucket_samples(self, sid: int, w: int, now: float, since: float = -math.inf
                       ) -> tuple[np.ndarray, np.ndarray]:
        idx, samples = [], []
        for part in self._parts:
            e = part.theirs.get(sid)
            if e is not None:
                i, s = part.engine.bucket_samples(e, w, now, since)
                idx.append(i)
                samples.append(s)
        if not idx:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        held, inv = np.unique(np.concatenate(idx), return_inverse=True)
        return held, np.bincount(inv, np.concatenate(samples), len(held)).astype(np.int64)

    def totals(self, sid: int, w: int, now: float, first: int | None = None
               ) -> np.ndarray | None:
        out = None
        for part in self._parts:
            e = part.theirs.get(sid)
            if e is not None:
                out = _add(out, part.engine.totals(e, w, now, first))
        return out

    # ------------------------------------------------------------ helpers

    def _engine_nows(self, part: _Part, nows: np.ndarray) -> np.ndarray:
        """Our nows by the engine's series ids (its free series: -inf)."""
        out = np.full(len(part.ours), -math.inf)
        mine = part.ours >= 0
        out[mine] = nows[part.ours[mine]]
        return out

    def _mapped(self, keys: Sequence[tuple[int, int]], nows: np.ndarray
                ) -> list[tuple[_Part, list[int], np.ndarray]]:
        """Per engine: the positions of the keys whose series it holds, and its nows."""
        out = []
        for part in self._parts:
            rows = [i for i, (sid, _) in enumerate(keys) if sid in part.theirs]
            if rows:
                out.append((part, rows, self._engine_nows(part, nows)))
        return out

    def _each(self, keys: Sequence[tuple[int, int]], nows: np.ndarray, *, classwise: bool
              ) -> list[tuple[_Part, list[int], tuple[WindowSums, ...]]]:
        """Each engine's window sums of the keys whose series it holds."""
        return [(part, rows, part.engine.window_sums(
                    [(part.theirs[keys[i][0]], keys[i][1]) for i in rows], enows,
                    classwise=classwise))
                for part, rows, enows in self._mapped(keys, nows)]


class _Following:
    """A reader's cursor on what the engines forgot (``SummedEngine.follow``)."""

    def __init__(self, summed: SummedEngine, cursor: Cursor) -> None:
        self.summed = summed
        self.cursor = cursor

    def take(self) -> list[tuple[str, str]] | None:
        self.summed.follow()
        return self.cursor.take()


def _add(have: np.ndarray | None, vec: np.ndarray | None) -> np.ndarray | None:
    """Vectors of integers held as float64 (``windows.Windows.totals``): sums are exact."""
    if vec is None:
        return have
    return vec.copy() if have is None else have + vec
