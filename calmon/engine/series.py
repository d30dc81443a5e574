"""Model x segment slice -> series ids, with cardinality folding.

A *series* is one (model, segment label) pair, e.g. ``("ctr-v3", "country=US")``
or ``("ctr-v3", "__all__")``. A prediction's segment values are folded first
(values past ``max_values`` per model and key become ``__other__``), then the
folded combination is interned as a *combo*: a small int that pending
predictions carry instead of their segment dict, and that maps to the tuple of
series the sample counts in. Both tables are bounded: at most
``(max_values + 1) ** keys`` combos and series per model, and ``limits.max_series``
series in all: past it, a slice's new segment series is not made and the sample
counts in its model's ``k=__other__`` series of that slice instead (counted in
``folded``; a model's ``__all__`` and ``__other__`` series are always made). A
dropped model's combos and series free their ids, which new ones reuse.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from calmon.names import ALL as ALL  # re-exported: older imports

OTHER = "__other__"


class SeriesIndex:
    def __init__(self, slices: tuple[tuple[str, ...], ...], max_values: int,
                 max_series: int | None = None) -> None:
        self.slices = slices
        self.max_series = max_series
        self.folded = 0  # segment series not made because of max_series (a running count)
        self._free_series: list[int] = []  # ids of dropped series, the lowest last
        self._free_combos: list[int] = []
        self.max_values = max_values
        # every key any slice uses, in first-use order: a combo stores one value per key
        self.keys: tuple[str, ...] = tuple(dict.fromkeys(k for s in slices for k in s))
        self._key_pos = {k: i for i, k in enumerate(self.keys)}
        self.series: list[tuple[str, str]] = []  # series id -> (model, segment label)
        self._series_ids: dict[tuple[str, str], int] = {}
        self.combos: list[tuple[str, tuple[str | None, ...]]] = []  # combo id -> (model, values)
        self.combo_series: list[tuple[int, ...]] = []  # combo id -> series ids
        self._combo_ids: dict[tuple[str, tuple[str | None, ...]], int] = {}
        self._admitted: dict[tuple[str, str], set[str]] = {}  # (model, key) -> kept values
        # model -> segment spelling -> combo
        self._fast: dict[str, dict[Hashable, int]] = {}
        self._fast_size = 0
        self._memo_cap = 4 * (max_values + 1) ** max(1, len(self.keys))
        # combo -> series as flat numpy arrays, rebuilt when combos are added
        self._flat = np.zeros(0, np.int64)
        self._start = np.zeros(0, np.int64)
        self._len = np.zeros(0, np.int64)
        self.generation = 0  # bumped whenever a combo or a series is added or dropped
        # bumped whenever an id is dropped or reused: while it stays, ids were only added
        # (what is built over the ids so far holds; ``_arrays``, the engine's maps)
        self.rewrites = 0
        self._arrays_at = -1
        self._arrays_rw = -1

    def combo_ids(self, models: list[str], keys: list[Hashable],
                  segments: list[dict[str, str]]) -> list[int]:
        """The combo ids of a batch's predictions, in order (a segment value is admitted
        first come, first served). ``keys``: each segment's spelling (``Parsed.p_segkey``)."""
        # hot path: a producer sends the same segment spelt the same way every time
        if models and models.count(models[0]) == len(models):  # one model: one memo
            out = list(map(self._fast.get(models[0], {}).get, keys))
        else:
            memo = self._fast
            out = [memo[m].get(k) if m in memo else None for m, k in zip(models, keys)]
        if None in out:  # misses in order: they are what admits values
            for i, cid in enumerate(out):
                if cid is None:
                    out[i] = self.combo(models[i], segments[i], keys[i])
        return out  # type: ignore[return-value]

    def combo(self, model: str, segment: dict[str, str], key: Hashable = None) -> int:
        """The combo id of a prediction; admits or folds its segment values."""
        fast = tuple(segment.items()) if key is None else key
        memo = self._fast.setdefault(model, {})
        cid = memo.get(fast)
        if cid is not None:
            return cid
        cid = self._combo_slow(model, segment)
        # memo only spellings made of configured keys: values are length-checked by the
        # parser, keys are not, and a memo must not hold what a producer makes up
        if self._fast_size < self._memo_cap and all(k in self._key_pos for k in segment):
            memo[fast] = cid
            self._fast_size += 1
        return cid

    def _combo_slow(self, model: str, segment: dict[str, str]) -> int:
        values = tuple(segment.get(k) for k in self.keys)
        cid = self._combo_ids.get((model, values))
        if cid is not None:
            return cid
        folded = tuple(None if v is None else self._fold(model, k, v)
                       for k, v in zip(self.keys, values))
        cid = self._combo_ids.get((model, folded))
        if cid is None:
            cid = self._intern(model, folded)
        if len(self._combo_ids) < self._memo_cap:
            self._combo_ids[(model, values)] = cid  # memo of the unfolded spelling, bounded
        return cid

    def _fold(self, model: str, key: str, value: str) -> str:
        kept = self._admitted.setdefault((model, key), set())
        if value in kept:
            return value
        if len(kept) < self.max_values:
            kept.add(value)
            return value
        return OTHER

    @property
    def held(self) -> int:
        """(model, segment) series held."""
        return len(self.series) - len(self._free_series)

    def _intern(self, model: str, folded: tuple[str | None, ...]) -> int:
        self.generation += 1
        if self._free_combos:
            self.rewrites += 1
            cid = self._free_combos.pop()
            self.combos[cid] = (model, folded)
        else:
            cid = len(self.combos)
            self.combos.append((model, folded))
            self.combo_series.append(())
        self._combo_ids[(model, folded)] = cid
        sids = [self.series_id(model, ALL)]
        for sl in self.slices:
            vals = [folded[self._key_pos[k]] for k in sl]
            if any(v is None for v in vals):
                continue  # a sample lacking a key of this slice does not count in it
            label = ",".join(f"{k}={v}" for k, v in zip(sl, vals))
            if ((model, label) not in self._series_ids and self.max_series is not None
                    and self.held >= self.max_series):
                self.folded += 1
                label = ",".join(f"{k}={OTHER}" for k in sl)
            sids.append(self.series_id(model, label))
        self.combo_series[cid] = tuple(sids)
        return cid

    def drop_model(self, model: str) -> list[int]:
        """Forget a model's combos and series (it was idle); returns its series ids."""
        self.generation += 1
        self.rewrites += 1
        cids = [c for c, (m, _) in enumerate(self.combos) if m == model]
        sids = [s for s, (m, _) in enumerate(self.series) if m == model]
        for c in cids:
            self.combos[c] = ("", ())
            self.combo_series[c] = ()
        for s in sids:
            del self._series_ids[self.series[s]]
            self.series[s] = ("", "")
        self._combo_ids = {k: v for k, v in self._combo_ids.items() if k[0] != model}
        self._admitted = {k: v for k, v in self._admitted.items() if k[0] != model}
        memo = self._fast.pop(model, None)
        if memo:
            self._fast_size -= len(memo)
        self._free_combos = sorted(self._free_combos + cids, reverse=True)
        self._free_series = sorted(self._free_series + sids, reverse=True)
        return sids

    def drop_combos(self, cids: list[int]) -> list[int]:
        """Forget these combos (idle) of live models, and the series and admitted
        segment values no other combo of their model uses; returns the freed series."""
        self.generation += 1
        self.rewrites += 1
        dead = set(cids)
        models = {self.combos[c][0] for c in cids}
        for c in cids:
            self.combos[c] = ("", ())
            self.combo_series[c] = ()
        self._combo_ids = {k: v for k, v in self._combo_ids.items() if v not in dead}
        for m in models:
            memo = self._fast.get(m)
            if memo:
                keep = {k: v for k, v in memo.items() if v not in dead}
                self._fast_size -= len(memo) - len(keep)
                self._fast[m] = keep
        freed = []
        for m in models:
            live = [c for c, (mm, _) in enumerate(self.combos) if mm == m]
            used = {s for c in live for s in self.combo_series[c]}
            for s, (mm, seg) in enumerate(self.series):
                if mm == m and s not in used and seg != ALL:
                    del self._series_ids[(mm, seg)]
                    self.series[s] = ("", "")
                    freed.append(s)
            values = {(k, v) for c in live for k, v in zip(self.keys, self.combos[c][1])
                      if v is not None}
            for (mm, k), kept in self._admitted.items():
                if mm == m:
                    kept &= {v for kk, v in values if kk == k}
        self._free_combos = sorted(self._free_combos + cids, reverse=True)
        self._free_series = sorted(self._free_series + freed, reverse=True)
        return freed

    def _arrays(self) -> None:
        if self._arrays_at == self.generation and len(self._len) == len(self.combo_series):
            return
        self._arrays_at = self.generation
        n = len(self._len) if self._arrays_rw == self.rewrites else 0  # combos as built
        self._arrays_rw = self.rewrites
        new = self.combo_series[n:]
        lens = np.array([len(t) for t in new], np.int64)
        head = int(self._len[:n].sum())
        self._len = np.concatenate((self._len[:n], lens))
        self._start = np.concatenate((self._start[:n], head + np.cumsum(lens) - lens))
        self._flat = np.concatenate((self._flat[:head],
                                     np.array([s for t in new for s in t], np.int64)))

    def fan_out(self, combos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For samples with these combos: (sample index, series id) for every series each
        sample counts in, sample by sample."""
        self._arrays()
        lens = self._len[combos]
        sample = np.repeat(np.arange(len(combos)), lens)
        first = np.cumsum(lens) - lens  # where each sample's run starts in the output
        within = np.arange(int(lens.sum())) - np.repeat(first, lens)
        return sample, self._flat[np.repeat(self._start[combos], lens) + within]

    def all_series(self, combos: np.ndarray) -> np.ndarray:
        """The model's ``__all__`` series id of each combo (always its first series)."""
        self._arrays()
        out: np.ndarray = self._flat[self._start[combos]]
        return out

    def series_id(self, model: str, segment: str) -> int:
        sid = self._series_ids.get((model, segment))
        if sid is None:
            self.generation += 1
            if self._free_series:
                self.rewrites += 1
                sid = self._free_series.pop()
                self.series[sid] = (model, segment)
            else:
                sid = len(self.series)
                self.series.append((model, segment))
            self._series_ids[(model, segment)] = sid
        return sid

    def find(self, model: str, segment: str) -> int | None:
        return self._series_ids.get((model, segment))

    def snapshot(self) -> dict[str, Any]:
        return {
            "series": [list(s) for s in self.series],
            "combos": [[m, list(v)] for m, v in self.combos],
            "combo_series": [list(t) for t in self.combo_series],  # v3: max_series folds
            "admitted": [[m, k, sorted(vs)] for (m, k), vs in self._admitted.items()],
        }

    def restore(self, snap: dict[str, Any]) -> None:
        """Ids as they were (a dropped model's are free: model "")."""
        for sid, (model, seg) in enumerate(snap["series"]):
            self.series.append((model, seg))
            if model:
                self._series_ids[(model, seg)] = sid
            else:
                self._free_series.insert(0, sid)
        given = snap.get("combo_series")
        for cid, (model, values) in enumerate(snap["combos"]):
            if given is None:  # before v3: made again as they were made
                self._free_combos = []
                self._intern(model, tuple(values))
                continue
            folded = tuple(values)
            self.combos.append((model, folded))
            self.combo_series.append(tuple(int(s) for s in given[cid]))
            if model:
                self._combo_ids[(model, folded)] = cid
            else:
                self._free_combos.insert(0, cid)
        self._admitted = {(m, k): set(vs) for m, k, vs in snap["admitted"]}
        self.generation += 1
        self.rewrites += 1
