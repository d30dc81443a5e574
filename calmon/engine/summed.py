"""The statistics of several engines as one (group mode, contract §8): each task (an
input partition) has its own ``Engine``, and what an instance exports is every
series summed over the tasks it owns. Binned counts add exactly, so the window
vectors of a (model, segment, window) are summed and the plug-in statistics computed
on the sum: the same numbers one engine fed every task's records would give.

The windows of a model slide on its latest event time over all the tasks (as one
engine's would), not on each task's own. The expensive statistics (intervals, smooth
and debiased ECE, estimates, PSI) are not computed here: their families stay empty
in group mode for now.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from calmon.config import Config
from calmon.engine.engine import Engine, ReadState
from calmon.engine.metrics import plugin_stats
from calmon.engine.rows import Row, Snapshot, empty


class SummedRefresher:
    """``Refresher``'s reading side over the engines ``engines()`` returns: ``update``
    builds a new ``latest`` from all of them (the loop thread calls it between
    batches); any thread reads ``latest``."""

    def __init__(self, cfg: Config, engines: Callable[[], Sequence[Engine]]) -> None:
        self.cfg = cfg
        self.engines = engines
        self.latest: Snapshot = empty(time.time())
        self._serial = 0

    def update(self, *, full: bool = False) -> Snapshot:
        engines = list(self.engines())
        states = [e.read_state(-1) for e in engines]
        nows: dict[str, float] = {}
        for st in states:
            for sid, (model, _) in enumerate(st.series):
                if model:
                    nows[model] = max(nows.get(model, -np.inf), float(st.nows[sid]))
        sums: dict[tuple[str, str, int], np.ndarray] = {}
        binary: dict[tuple[str, str], bool] = {}
        for engine, st in zip(engines, states):
            self._add(engine, st, nows, sums, binary)
        names = [w.name for w in self.cfg.metrics.windows]
        lay = engines[0].layout if engines else None
        rows = [] if lay is None else [
            Row(m, s, names[w], binary[(m, s)],
                plugin_stats(vec, lay, binary[(m, s)], self.cfg.metrics.mce_min_samples))
            for (m, s, w), vec in sorted(sums.items())]
        counters: Counter[str] = Counter()
        for st in states:
            counters.update(st.counters)
        self._serial += 1
        self.latest = Snapshot(
            now=max((st.now for st in states), default=-float("inf")), rows=rows,
            counters=dict(counters), pending=sum(st.pending for st in states),
            pending_labels=sum(st.pending_labels for st in states),
            series=sorted(binary), version=self._serial, series_held=len(binary),
            built_at=time.time(), serial=self._serial)
        return self.latest

    def _add(self, engine: Engine, st: ReadState, nows: dict[str, float],
             sums: dict[tuple[str, str, int], np.ndarray],
             binary: dict[tuple[str, str], bool]) -> None:
        """One engine's window vectors added to ``sums``, read at the models' nows."""
        sids = [s for s in sorted(st.with_data) if s < len(st.series) and st.series[s][0]]
        if not sids:
            return
        at = np.array(st.nows, dtype=float)
        for s in sids:
            at[s] = nows[st.series[s][0]]
        keys = [(s, w) for s in sids for w in range(len(self.cfg.metrics.windows))]
        for (s, w), ws in zip(keys, engine.window_sums(keys, at, classwise=False)):
            model, segment = st.series[s]
            binary[(model, segment)] = st.binary[s]
            if ws.vec is None:
                continue
            key = (model, segment, w)
            have = sums.get(key)
            sums[key] = ws.vec.astype(np.int64) if have is None else have + ws.vec
