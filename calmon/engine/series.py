"""Model x segment slice -> series ids, with cardinality folding.

A *series* is one (model, segment label) pair, e.g. ``("ctr-v3", "country=US")``
or ``("ctr-v3", "__all__")``. A prediction's segment values are folded first
(values past ``max_values`` per model and key become ``__other__``), then the
folded combination is interned as a *combo*: a small int that pending
predictions carry instead of their segment dict, and that maps to the tuple of
series the sample counts in. Both tables are bounded: at most
``(max_values + 1) ** keys`` combos and series per model.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

ALL = "__all__"
OTHER = "__other__"


class SeriesIndex:
    def __init__(self, slices: tuple[tuple[str, ...], ...], max_values: int) -> None:
        self.slices = slices
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

    def _intern(self, model: str, folded: tuple[str | None, ...]) -> int:
        self.generation += 1
        cid = len(self.combos)
        self.combos.append((model, folded))
        self._combo_ids[(model, folded)] = cid
        sids = [self.series_id(model, ALL)]
        for sl in self.slices:
            vals = [folded[self._key_pos[k]] for k in sl]
            if any(v is None for v in vals):
                continue  # a sample lacking a key of this slice does not count in it
            sids.append(self.series_id(model, ",".join(f"{k}={v}" for k, v in zip(sl, vals))))
        self.combo_series.append(tuple(sids))
        return cid

    def _arrays(self) -> None:
        if len(self._len) != len(self.combo_series):
            self._len = np.array([len(t) for t in self.combo_series], np.int64)
            self._start = np.concatenate(([0], np.cumsum(self._len)[:-1])).astype(np.int64)
            self._flat = np.array([s for t in self.combo_series for s in t], np.int64)

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
            "admitted": [[m, k, sorted(vs)] for (m, k), vs in self._admitted.items()],
        }

    def restore(self, snap: dict[str, Any]) -> None:
        for model, seg in snap["series"]:
            self.series_id(model, seg)
        for model, values in snap["combos"]:
            self._intern(model, tuple(values))
        self._admitted = {(m, k): set(vs) for m, k, vs in snap["admitted"]}
