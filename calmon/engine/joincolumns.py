"""The columnar join (``JoinColumns.run_all``): a batch decided over numpy columns where no
decision depends on another, and only the records whose id has a history sent through
``run`` one by one (``_run_odd``), what both did merged in batch order
(``_merge_joins``). The property test of tests/unit/engine/test_columnar_join.py holds
it to ``run``."""

from __future__ import annotations

from itertools import repeat

import numpy as np

from calmon.engine.joined import _E
from calmon.engine.joinrun import JoinRun
from calmon.engine.joinstate import INF, ROW_SHIFT
from calmon.engine.parsed import LABEL, PRED, Parsed
from calmon.engine.records import MULTICLASS


class JoinColumns(JoinRun):
    """The join over a whole batch's columns."""

    def run_all(self, b: Parsed) -> None:
        """The whole batch, every prediction admitted. The same result as
        ``run(b, 0, len(b), 0, 0)``, which it falls back to where the batch is not plain
        (see ``_run_columns``) or small: the columns' fixed cost pays from about 2,000
        records (measured: +8% at 5,000, +3% at 2,000, -2% at 1,000 and -10% at 100
        joined samples/s)."""
        if len(b.kinds) < self.columns_from or not self._run_columns(b):
            self.run(b, 0, len(b), 0, 0)

    def _model_runs(self, pts: np.ndarray) -> dict[int, tuple[np.ndarray | None, np.ndarray]]:
        """Per model of the batch: the ordinals of its predictions (None: all of them)
        and its now after each (a running max from its now before the batch)."""
        pm = np.asarray(self._pm, np.int64)
        if not len(pm):
            return {}
        first = int(pm[0])
        if (pm == first).all():  # the common batch: one model
            return {first: (None, np.maximum.accumulate(np.maximum(pts, self.nows[first])))}
        out: dict[int, tuple[np.ndarray | None, np.ndarray]] = {}
        for m in np.unique(pm).tolist():
            ords = np.flatnonzero(pm == m)
            out[m] = (ords, np.maximum.accumulate(np.maximum(pts[ords], self.nows[m])))
        return out

    @staticmethod
    def _now_before(run: tuple[np.ndarray | None, np.ndarray], k: np.ndarray,
                    before: float) -> np.ndarray:
        """A model's now once the batch's first ``k`` predictions were seen."""
        ords, acc = run
        n = k if ords is None else np.searchsorted(ords, k)  # its predictions among them
        out: np.ndarray = np.where(n > 0, acc[np.maximum(n - 1, 0)], before)
        return out

    def _run_columns(self, b: Parsed) -> bool:
        """``run`` over a whole batch, decided over columns where no decision depends on
        another: each id at most once among the batch's predictions and once among its
        labels, far from every bound, no implicit negatives. A record is "plain" when
        its id has no state but a pending prediction of an earlier batch that its label
        joins in time, or a prediction of this batch that its later label joins in time;
        the others go through ``run`` one by one in batch order, with the now they would
        have seen (ids are independent, so their order among plain records does not
        matter), and what both did is merged in batch order. None: use ``run``."""
        p_of = self._columns_fit(b)
        if p_of is None:
            return False
        p_id, l_id = b.p_id, b.l_id
        n_p, n_l = len(p_id), len(l_id)
        cols = self._batch
        kinds = np.frombuffer(bytes(b.kinds), np.uint8)
        p_pos = np.flatnonzero(kinds == PRED)
        l_pos = np.flatnonzero(kinds == LABEL)
        pts = cols.ts
        clock0 = self.clock
        nows0 = list(self.nows)
        runs = self._model_runs(pts)
        if n_p:
            self._next_deadline = min(self._next_deadline, float(pts.min()) + self.ttl)
        # the state of each id before the batch (its slot: what prepare found)
        pair = np.fromiter(map(p_of.get, l_id, repeat(-1)), np.int64, n_l)
        old = self._found[n_p:]
        odd_p, odd_l, p_deadline = self._odd(b, pair, old, p_pos, l_pos, runs, nows0)
        paired = pair >= 0
        plain_l = ~odd_l
        # the plain labels: joined, or out of the range of their prediction's classes
        lab = self._labels_of_batch[0]
        src = np.where(paired, ~pair, old)
        classes = self._label_classes(b, plain_l, pair, old)
        wrong = plain_l & (lab >= 2) & (lab >= classes)
        joins = np.flatnonzero(plain_l & ~wrong)
        # the others, one by one, in batch order
        odd = np.sort(np.concatenate([p_pos[odd_p], l_pos[odd_l]]))
        odd_freed = (self._run_odd(b, odd.tolist(), p_pos, l_pos, runs, nows0, clock0)
                     if len(odd) else [])
        for m, (_, acc) in runs.items():  # every model's now as the batch leaves it
            self.nows[m] = float(acc[-1])
        if n_p:
            self.clock = max(clock0, float(pts.max()))
        ev = self.events
        if wrong.any():
            ev.out_of_range = sorted(ev.out_of_range + np.flatnonzero(wrong).tolist())
        # what the plain labels joined, merged with what the others did in batch order
        j_ids = list(map(l_id.__getitem__, joins.tolist()))
        if len(j_ids):
            self._merge_joins(src[joins], joins, l_pos[joins], p_pos, l_pos, j_ids,
                              p_deadline[joins])
            self._free_joined(l_id, joins[~paired[joins]], old, l_pos, odd_freed)
        # plain predictions left pending: those no plain label joined
        pend = ~odd_p
        pend[pair[joins][paired[joins]]] = False
        # (no plain id is looked up again in this batch: finish gives them their slots)
        self._fresh += int(np.count_nonzero(pend))
        return True

    def _columns_fit(self, b: Parsed) -> dict[str, int] | None:
        """Each prediction id's ordinal when the batch can be decided over columns (each
        id once per kind, far from every bound, no implicit negatives), else None."""
        p_id, l_id = b.p_id, b.l_id
        n_p, n_l = len(p_id), len(l_id)
        done, labels = self._done, self._labels
        cap = self.max_pending
        if (self.implicit is not None or self._heaps is not None or self._undated_labels
                or self.clock == -INF or n_p + self.pending > cap or len(labels) + n_l > cap
                or len(b.kinds) > cap - len(done)):
            return None
        p_of = dict(zip(p_id, range(n_p)))
        if len(p_of) != n_p or len(set(l_id)) != n_l:
            return None
        return p_of

    def _odd(self, b: Parsed, pair: np.ndarray, old: np.ndarray, p_pos: np.ndarray,
             l_pos: np.ndarray, runs: dict[int, tuple[np.ndarray | None, np.ndarray]],
             nows0: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which predictions and labels go one by one (their id has state, or the label
        would not join in time), and the deadline of the prediction each label meets.
        ``pair``: each label's prediction in this batch (-1: none); ``old``: its slot."""
        p_id = b.p_id
        n_p = len(p_id)
        done, labels = self._done, self._labels
        pts = self._batch.ts
        before = np.searchsorted(p_pos, l_pos)  # predictions before each label
        now_l = self._label_nows(pair, old, before, runs, nows0)
        odd_p = self._found[:n_p] >= 0  # predictions whose id has state: one by one
        if done:
            odd_p |= np.fromiter(map(done.__contains__, p_id), bool, n_p)
        if labels:
            odd_p |= np.fromiter(map(labels.has, p_id), bool, n_p)
        paired = pair >= 0
        pp = pair[paired]
        old_ts = self._ts[np.where(paired, 0, old)]  # old >= 0 wherever it is read
        # a label joins in time: its prediction's deadline (ts + ttl) not yet passed
        p_deadline = np.where(paired, pts[np.where(paired, pair, 0)] if n_p else 0.0,
                              old_ts) + self.ttl
        overdue = p_deadline <= now_l  # (a deadline is never below _next_deadline)
        odd_l = np.where(paired, False, old < 0) | overdue | (self._labels_of_batch[0] < 0)
        if len(pp):
            odd_l[paired] |= odd_p[pp] | (p_pos[pp] > l_pos[paired])
            odd_p[pp] |= odd_l[paired]
        return odd_p, odd_l, p_deadline

    def _label_nows(self, pair: np.ndarray, old: np.ndarray, before: np.ndarray,
                    runs: dict[int, tuple[np.ndarray | None, np.ndarray]],
                    nows0: list[float]) -> np.ndarray:
        """Each label's now: that of the model of the prediction it meets, as it stood
        at the label (labels that meet none wait, one by one)."""
        m_l = np.full(len(pair), -1, np.int64)
        has_old = (pair < 0) & (old >= 0)
        m_l[pair >= 0] = np.asarray(self._pm, np.int64)[pair[pair >= 0]]
        m_l[has_old] = self.combo_model[self._combo[old[has_old]]]
        now_l = np.full(len(pair), -INF)
        for m in np.unique(m_l[m_l >= 0]).tolist():
            sel = m_l == m
            run = runs.get(m)
            now_l[sel] = nows0[m] if run is None else self._now_before(run, before[sel],
                                                                       nows0[m])
        return now_l

    def _label_classes(self, b: Parsed, plain_l: np.ndarray, pair: np.ndarray,
                       old: np.ndarray) -> np.ndarray:
        """The class count of the prediction each plain label meets (2 for binary)."""
        paired = pair >= 0
        cols = self._batch
        kind_l = np.where(paired, cols.kind[np.where(paired, pair, 0)] if len(b.p_id) else 0,
                          self._kind[np.where(paired, 0, old)])
        classes = np.full(len(pair), 2, np.int64)
        multi = plain_l & (kind_l >= MULTICLASS)
        if multi.any():
            classes[multi & paired] = np.asarray(b.p_classes, np.int64)[pair[multi & paired]]
            codes = self._score[old[multi & ~paired]].astype(np.int64)
            classes[multi & ~paired] = codes % ROW_SHIFT
        return classes

    def _free_joined(self, l_id: list[str], by_old: np.ndarray, old: np.ndarray,
                     l_pos: np.ndarray, odd_freed: list[tuple[int, int]]) -> None:
        """The slots of earlier batches' predictions the plain labels ``by_old`` joined
        are freed, in batch order with those the odd records freed."""
        freed = old[by_old].tolist()
        if freed:
            for pid in map(l_id.__getitem__, by_old.tolist()):
                del self._slot[pid]
            pids = self._pid
            for _ in map(pids.__setitem__, freed, repeat(None)):  # a C loop
                pass
            if odd_freed:  # freed slots are reused in this order: batch order
                pos = l_pos[by_old].tolist()
                self._freed = [v for _, v in sorted(odd_freed + list(zip(pos, freed)))]
            else:
                self._freed.extend(freed)

    def _run_odd(self, b: Parsed, odd: list[int], p_pos: np.ndarray, l_pos: np.ndarray,
                 runs: dict[int, tuple[np.ndarray | None, np.ndarray]], nows0: list[float],
                 clock0: float) -> list[tuple[int, int]]:
        """Records ``odd`` (batch indices, in order) through ``run``, each with the clocks
        it would have seen in a whole-batch ``run``: the instance's, and those of the
        models it can meet (its own, the pending prediction's with its id).
        Returns the slots they freed, with the batch index of the record that did."""
        is_p = np.isin(odd, p_pos).tolist()
        p_ord = np.searchsorted(p_pos, odd).tolist()  # predictions before: one's ordinal
        l_ord = np.searchsorted(l_pos, odd).tolist()
        pts = self._batch.ts
        clocks = np.maximum.accumulate(np.maximum(pts, clock0)) if len(pts) else _E
        run = self.run
        freed = self._freed
        nows, pm = self.nows, self._pm
        out = []
        for i, pred, p, q in zip(odd, is_p, p_ord, l_ord):
            n = len(freed)
            self.clock = float(clocks[p - 1]) if p else clock0
            pid = b.p_id[p] if pred else b.l_id[q]
            v = self._slot.get(pid)
            meet = (pm[p] if pred else None, None if v is None else self._model_of(v))
            for m in meet:
                if m is not None and m in runs:
                    nows[m] = float(self._now_before(runs[m], np.array(p), nows0[m]))
            run(b, i, i + 1, p, q)
            out += [(i, v) for v in freed[n:]]
        return out

    def _merge_joins(self, src: np.ndarray, q: np.ndarray, pos: np.ndarray,
                     p_pos: np.ndarray, l_pos: np.ndarray, ids: list[str],
                     deadlines: np.ndarray) -> None:
        """Add the plain joins (sources, label ordinals, batch indices, ids, tombstone
        deadlines) to what the records run one by one joined, in batch order: the joined
        samples and the remembered ids (each join made one) keep the order of a
        whole-batch ``run``."""
        done, done_order = self._done, self._done_order
        done.update(zip(ids, deadlines.tolist()))
        if not self._j_src:
            self._j_src = src.tolist()
            self._j_q = q.tolist()
            done_order.extend(ids)
            return
        o_src = np.asarray(self._j_src, np.int64)
        o_q = np.asarray(self._j_q, np.int64)
        # a join by a label sits at the label; one made by a prediction that met its
        # waiting label (o_q < 0: its label is in _x_*), at the prediction
        by_label = o_q >= 0
        o_pos = np.empty(len(o_q), np.int64)
        o_pos[by_label] = l_pos[o_q[by_label]]
        o_pos[~by_label] = p_pos[~o_src[~by_label]]
        order = np.argsort(np.concatenate([o_pos, pos]), kind="stable")
        self._j_src = np.concatenate([o_src, src])[order].tolist()
        self._j_q = np.concatenate([o_q, q])[order].tolist()
        # theirs (one per join), then the plain ones: listed once, then read in order
        every = [done_order.pop() for _ in range(len(o_src))][::-1] + ids
        done_order.extend(map(every.__getitem__, order.tolist()))
