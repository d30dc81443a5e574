"""Label-free estimates of the pending predictions (contract section 2, v5).

Each round of the statistics (``metrics.refresh``) reads the predictions still waiting
for their label once (``pending_sums``) and keeps, per series and window, two readings
of them:

- as fine-bin counts of their raw confidence, by decision side (binary: decided
  positive, by the prediction's own decision or else ``p >= models.<m>.threshold``,
  or negative), to be read through an estimation map (``estmap``);
- through the live calibrator (raw scores without one): the v2-v4 reading, and the
  fallback when no map can be had.

``Maps`` holds each series' estimation map: the isotonic fit of the fine-bin counts of
the newest buckets of the largest window until they hold ``estimates.samples``
labelled samples, refitted only when those counts changed, and kept when the labels
pause (the series' ``last`` map). ``estimate`` picks the reading, in the contract's
order: the series' map, the model's ``__all__`` map, the series' last map, the live
calibrator, the raw scores. A multiclass window holding a prediction whose own decision
is not its argmax is read through the live calibrator (the decided class's probability)
or raw: a map of the top-label confidence says nothing of another class.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from calmon.config import EstimatesConfig
from calmon.engine.decisions import binary_decided, multi_decided
from calmon.engine.estimates import Estimates, psi
from calmon.engine.estmap import Fit, Reading, Side, fit_stack, read
from calmon.engine.records import MULTICLASS, SCORE_KINDS
from calmon.engine.scoring import raw_probs
from calmon.engine.windows import BUCKETS, CONF_SCALE, Layout, Windows, bin_index
from calmon.names import ALL

log = logging.getLogger(__name__)

Live = tuple[Any, "np.ndarray | None"]  # (apply, reference) of a live calibrator
MapKey = tuple[str, str, int]  # (model, segment, class count) a map was fitted for


@dataclass(frozen=True)
class Pending:
    """One (series, window)'s pending predictions: how many; through the live calibrator
    (raw without one) their summed confidence c of the decided class, summed P(y=1) and
    summed c(1 - c), in fixed point (the same whatever order the join keeps them in);
    and their raw confidences as fine-bin ``Side``s for a map."""

    n: int
    top: float
    pos: float
    var: float
    sides: tuple[Side, ...]
    differs: bool = False  # v5: multiclass, a decision other than the argmax among them


PendingCounts = Mapping[tuple[int, int], Pending]


@dataclass(frozen=True)
class _Rows:
    """The pending rows of one model read once: each row's calibrated confidence of the
    decided class and P(y=1), raw confidence (fixed point), fine bin and side."""

    rows: np.ndarray
    top: np.ndarray
    pos: np.ndarray
    confq: np.ndarray
    fbin: np.ndarray
    flip: np.ndarray  # binary: decided negative (right when y = 0)
    binary: bool
    differs: np.ndarray  # multiclass: decided other than the argmax

    def pending(self, at: np.ndarray) -> Pending:
        top, pos = self.top[at], self.pos[at]
        return Pending(len(at), _fixed_sum(top), _fixed_sum(pos), _fixed_sum(top * (1.0 - top)),
                       _sides(self.fbin[at], self.confq[at], self.flip[at], self.binary),
                       bool(self.differs[at].any()))


def pending_sums(waiting: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                dict[int, Any], np.ndarray],
                 model_of: np.ndarray, fan_out: Callable[[np.ndarray], tuple[Any, Any]],
                 names: Sequence[tuple[str, str]], model_index: Mapping[str, int],
                 calibrator: Callable[[str, str], Live | None],
                 threshold: Callable[[str], float], windows: Windows,
                 series_nows: np.ndarray) -> dict[tuple[int, int], Pending]:
    """``Pending`` of every (series, window) from the join's waiting rows (``waiting``:
    combo, ts, kind, binary score, {row: K scores}, decision; ``model_of``: each row's model
    index), the windows sliding on each series' model's now. One pass: each model's
    rows are read once per calibrator, then summed per series and window."""
    combo, ts, kind, score, vectors, decision = waiting
    out: dict[tuple[int, int], Pending] = {}
    if len(combo) == 0:
        return out
    buckets = [np.floor(ts / width).astype(np.int64) for width in windows.widths]
    sample, sid = fan_out(combo)
    floors = [windows.current(w, series_nows[sid]) - BUCKETS
              for w in range(len(windows.widths))]
    cache: dict[tuple[int, int], _Rows] = {}
    order = np.argsort(sid, kind="stable")
    uniq, starts = np.unique(sid[order], return_index=True)
    for s, part in zip(uniq.tolist(), np.split(order, starts[1:])):
        name, segment = names[s]
        live = calibrator(name, segment)
        rows = sample[part]
        if not name:  # a dropped model's series: its pending predictions went too
            continue
        midx = model_index[name]
        key = (midx, id(live[0]) if live is not None else 0)
        hit = cache.get(key)
        if hit is None:
            mine = np.flatnonzero(model_of == midx)
            hit = cache[key] = _read_rows(mine, kind, score, vectors, decision, live,
                                          threshold(name), windows.layout.fine_bins)
        at = np.searchsorted(hit.rows, rows)
        for w, bkt in enumerate(buckets):
            keep = bkt[rows] > floors[w][part]
            if keep.any():
                out[(s, w)] = hit.pending(at[keep])
    return out


def _read_rows(rows: np.ndarray, kind: np.ndarray, score: np.ndarray,
               vectors: dict[int, Any], decision: np.ndarray, live: Live | None,
               threshold: float, fine_bins: int) -> _Rows:
    """Rows of one model (one score family: binary or K-class), read raw and through
    ``live`` (identity without one), each scored on the class it decided."""
    n = len(rows)
    top, pos, conf = np.empty(n), np.zeros(n), np.empty(n)
    flip, differs = np.zeros(n, bool), np.zeros(n, bool)
    binary = True
    # one group per score kind and class count (a model's K can change on a reset)
    k = kind[rows] * 1_000_000
    multi = np.flatnonzero(k >= 2_000_000)
    k[multi] += np.array([len(vectors[i]) for i in rows[multi].tolist()], np.int64)
    for group in np.unique(k).tolist():
        code = group // 1_000_000
        part = np.flatnonzero(k == group)
        if code < MULTICLASS:
            raw = score[rows[part]]
        else:
            binary = False
            raw = np.array([vectors[i] for i in rows[part].tolist()], dtype=np.float64)
        own = raw_probs(raw, code)  # the model's own probabilities: its decision
        probs = _through(live, raw, code)
        cal = own if probs is None else probs
        given = decision[rows[part]]
        if own.ndim == 1:
            decided = binary_decided(own, threshold, given) == 1
            top[part] = np.where(decided, cal, 1.0 - cal)
            pos[part] = cal
            conf[part] = own
            flip[part] = ~decided
        else:
            decided = multi_decided(own, given)
            top[part] = cal[np.arange(len(cal)), decided]
            conf[part] = own.max(axis=1)
            differs[part] = decided != own.argmax(axis=1)
    return _Rows(rows, top, pos, np.rint(conf * CONF_SCALE), bin_index(conf, fine_bins),
                 flip, binary, differs)


def _through(live: Live | None, raw: np.ndarray, code: int) -> np.ndarray | None:
    """The live calibrator's probabilities of these raw scores, or None (no calibrator,
    or one that fails or answers in the wrong shape: a broken calibrator must not break
    /metrics)."""
    if live is None:
        return None
    try:
        probs = np.asarray(live[0](raw, SCORE_KINDS[code]), np.float64)
        if probs.shape != raw.shape[:1] + (() if code < MULTICLASS else raw.shape[1:]):
            raise ValueError(f"calibrated shape {probs.shape} for {raw.shape}")
    except Exception:
        log.exception("the live calibrator failed on pending scores; raw used")
        return None
    return probs


def _sides(fbin: np.ndarray, confq: np.ndarray, flip: np.ndarray,
           binary: bool) -> tuple[Side, ...]:
    """Fine-bin counts and summed raw confidence of these rows, by side; only the bins
    they occupy (``estmap.read`` reads non-empty bins only)."""
    out = []
    for side in (False, True) if binary else (False,):
        mine = flip == side
        if not mine.any():
            continue
        _, inv = np.unique(fbin[mine], return_inverse=True)
        count = np.bincount(inv).astype(np.float64)
        conf = np.bincount(inv, weights=confq[mine]) / CONF_SCALE  # integers: exact sums
        out.append(Side(count, conf, side, np.unique(fbin[mine])))
    return tuple(out)


def _fixed_sum(x: np.ndarray) -> float:
    return float(np.rint(x * CONF_SCALE).astype(np.int64).sum()) / CONF_SCALE


def merged(parts: Sequence[Pending]) -> Pending:
    """One (series, window)'s pending predictions held by several engines, as one
    engine holding them all reads them: counts and fixed-point sums add exactly, and
    each side's fine bins are merged by index (group mode, ``summed``)."""
    if len(parts) == 1:
        return parts[0]
    sides = []
    for flip in (False, True):
        mine = [s for p in parts for s in p.sides if s.flip == flip]
        if not mine:
            continue
        fbin = np.concatenate([s.bins for s in mine if s.bins is not None])
        uniq, inv = np.unique(fbin, return_inverse=True)
        count = np.bincount(inv, weights=np.concatenate([s.count for s in mine]))
        confq = np.rint(np.concatenate([s.conf for s in mine]) * CONF_SCALE)
        sides.append(Side(count, np.bincount(inv, weights=confq) / CONF_SCALE, flip, uniq))
    return Pending(sum(p.n for p in parts), _fixed_sum(np.array([p.top for p in parts])),
                   _fixed_sum(np.array([p.pos for p in parts])),
                   _fixed_sum(np.array([p.var for p in parts])),
                   tuple(sides), any(p.differs for p in parts))


@dataclass(frozen=True)
class Map:
    """A series' estimation map, what it was fitted for and on."""

    key: MapKey
    fit: Fit
    newest_ts: float  # the end of the newest bucket behind it (at most the model's now)
    since: float  # the change it was fitted after (-inf: none)
    signature: bytes  # of the fine-bin counts it was fitted on


class Maps:
    """Every series' estimation map (``estimates.calibration: labelled``). A series'
    map is current while its largest window holds ``estimates.min_samples`` labelled
    samples; the last one fitted is kept after that, and while the series' slot holds
    the same model, segment and class count."""

    def __init__(self, cfg: EstimatesConfig, windows: Buckets) -> None:
        self.cfg = cfg
        self.windows = windows
        self.big = max(range(len(windows.widths)), key=lambda w: windows.widths[w])
        self._last: dict[int, Map] = {}
        self.touched: set[int] = set()  # series refitted since the changelog took them
        self._current: set[int] = set()
        self._fresh: set[int] = set()  # refreshed this round

    def new_round(self) -> None:
        self._fresh.clear()

    def snapshot(self, only: Iterable[int] | None = None) -> list[list[Any]]:
        """Every series' last map (``only``: these series'), for the checkpoint: a pause
        in the labels longer than the largest window keeps it across a restart too."""
        held = self._last if only is None else {s: self._last[s] for s in only
                                                if s in self._last}
        return [[sid, *m.key, m.fit.x, m.fit.y, m.fit.block, m.fit.weight, m.newest_ts,
                 None if math.isinf(m.since) else m.since, m.signature.hex()]
                for sid, m in sorted(held.items())]

    def restore(self, rows: list[Any], series: int) -> None:
        """The maps of ``snapshot``, checked (a checksum-valid checkpoint may still be
        crafted): raises ValueError on anything a fit could not have produced."""
        out: dict[int, Map] = {}
        for row in rows:
            sid, model, segment, classes, x, y, block, weight, newest, since, sig = row
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            block, weight = np.asarray(block, np.int64), np.asarray(weight, np.float64)
            n = len(x)
            if not (isinstance(sid, int) and 0 <= sid < series and isinstance(model, str)
                    and isinstance(segment, str) and isinstance(classes, int)):
                raise ValueError(f"maps: a bad series entry {sid!r}")
            if not (n and y.shape == block.shape == (n,) and x.ndim == 1 and weight.ndim == 1
                    and np.isfinite(x).all() and (np.diff(x) >= 0).all()
                    and ((y >= 0) & (y <= 1)).all() and (np.diff(y) >= 0).all()
                    and block[0] == 0 and ((np.diff(block) == 0) | (np.diff(block) == 1)).all()
                    and len(weight) == block[-1] + 1 and (weight > 0).all()
                    and np.isfinite(weight).all()):
                raise ValueError(f"maps: series {sid}'s map is not an isotonic fit")
            out[sid] = Map((model, segment, classes), Fit(x, y, block, weight), float(newest),
                           -math.inf if since is None else float(since), bytes.fromhex(sig))
        self._last = out
        self.touched.clear()
        self._current.clear()
        self._fresh.clear()

    def choose(self, sid: int, key: MapKey, since: float | None, model_sid: int | None,
               model_since: float | None, nows: np.ndarray) -> tuple[str, Map] | None:
        """The map the series' estimates read through, with its basis (``series``,
        ``model``, ``last``), or None (the live calibrator or the raw scores then).
        ``since``: the start of the series' current regime (a drift's ``change_ts``), of
        which alone its map is fitted; a map fitted before it is not used."""
        own = self._refreshed(sid, key, since, float(nows[sid]))
        if own is not None and sid in self._current:
            return "series", own
        if model_sid is not None and model_sid != sid:
            model = self._refreshed(model_sid, (key[0], ALL, key[2]), model_since,
                                    float(nows[model_sid]))
            if model is not None and model_sid in self._current:
                return "model", model
        if own is not None and (since is None or own.since >= since):
            return "last", own  # fitted on the current regime alone
        return None

    def _refreshed(self, sid: int, key: MapKey, since: float | None, now: float
                   ) -> Map | None:
        """The series' map after this round's refit (once a round), None without one
        fitted for ``key``."""
        if sid not in self._fresh:
            self._fresh.add(sid)
            self._refit(sid, key, since, now)
        held = self._last.get(sid)
        return held if held is not None and held.key == key else None

    def _refit(self, sid: int, key: MapKey, since: float | None, now: float) -> None:
        lay = self.windows.layout
        w = self._window_since(now, since)
        after = -math.inf if since is None else since
        # the newest buckets until they hold estimates.samples (all when they never do)
        idx, samples = self.windows.bucket_samples(sid, w, now, after)
        reach = np.cumsum(samples[::-1])
        k = min(int(np.searchsorted(reach, self.cfg.samples)), len(reach) - 1)
        if k < 0 or reach[k] < self.cfg.min_samples:
            self._current.discard(sid)
            return
        vec = self.windows.totals(sid, w, now, int(idx[::-1][k]))
        assert vec is not None  # the buckets just counted
        newest = int(idx[-1])
        self._current.add(sid)
        f = lay.fine_bins
        fine = vec[lay.fcount:lay.fcorrect + f]  # counts, summed confidences, corrects
        signature = hashlib.blake2b(fine.tobytes(), digest_size=16).digest()
        held = self._last.get(sid)
        if (held is not None and held.key == key and held.signature == signature
                and held.since == after):
            return  # no new labelled sample: the same fit
        fit = fit_stack(fine[None, :f], fine[None, f:2 * f] / CONF_SCALE, fine[None, 2 * f:])[0]
        if fit is None:
            return
        end = (newest + 1) * self.windows.widths[w]
        self._last[sid] = Map(key, fit, min(now, end), after, signature)
        self.touched.add(sid)

    def _window_since(self, now: float, since: float | None) -> int:
        """The window to read a map from: the largest; after a change, the one with the
        finest buckets that still reaches back to it (a bucket that starts before the
        change is left out, so the finer, the fewer post-change samples are lost)."""
        if since is None:
            return self.big
        widths = self.windows.widths
        reach = [w for w in range(len(widths)) if widths[w] * BUCKETS >= now - since]
        return min(reach, key=lambda w: widths[w]) if reach else self.big


def score_psi(counts: Callable[[bool], np.ndarray], reference: np.ndarray | None
              ) -> float | None:
    """PSI of the window's raw confidences (``counts(False)``) against the live
    calibrator's reference, else the window of the same length just before
    (``counts(True)``)."""
    current = counts(False)
    if reference is None or len(reference) != len(current):
        reference = counts(True)
    return psi(current, np.asarray(reference, np.float64))


class Buckets(Protocol):
    """What a map is fitted from: ``windows.Windows``, or several engines' summed."""

    @property
    def layout(self) -> Layout: ...

    @property
    def widths(self) -> Sequence[float]: ...

    def bucket_samples(self, sid: int, w: int, now: float, since: float = -math.inf
                       ) -> tuple[np.ndarray, np.ndarray]: ...

    def totals(self, sid: int, w: int, now: float, first: int | None = None
               ) -> np.ndarray | None: ...


class Source(Protocol):
    """What the estimates of a series read (``reading.Reading``: one engine's;
    ``summed.SummedEngine``: several engines' as one)."""

    @property
    def maps(self) -> Maps: ...

    @property
    def changes(self) -> Mapping[tuple[str, str], float]: ...

    def series_name(self, sid: int) -> tuple[str, str]: ...

    def find(self, model: str, segment: str) -> int | None: ...

    def is_binary(self, sid: int) -> bool: ...

    def class_count(self, model: str) -> int: ...

    def calibrator_of(self, model: str, segment: str) -> Live | None: ...

    def score_counts(self, sid: int, w: int, now: float, previous: bool) -> np.ndarray: ...


def series_estimates(src: Source, sids: Sequence[int], pending: PendingCounts,
                     nows: np.ndarray, windows: int, labelled: bool, level: float
                     ) -> dict[tuple[int, int], Estimates]:
    """The label-free estimates and score PSI of every window of these series, from
    ``pending`` (``pending_sums``), the estimation maps and the live calibrators."""
    out: dict[tuple[int, int], Estimates] = {}
    changes = src.changes
    for sid in sids:
        model, segment = src.series_name(sid)
        live = src.calibrator_of(model, segment)
        binary = src.is_binary(sid)
        chosen = None
        if labelled and model:
            key = (model, segment, src.class_count(model))
            since = changes.get((model, ALL))
            chosen = src.maps.choose(sid, key, changes.get((model, segment), since),
                                     src.find(model, ALL), since, nows)
        now = float(nows[sid])
        for w in range(windows):
            counts = partial(src.score_counts, sid, w, now)
            psi_ = score_psi(counts, None if live is None else live[1])
            out[(sid, w)] = estimate(pending.get((sid, w)), psi_, chosen,
                                     "raw" if live is None else "live", binary, level)
    return out


def estimate(pending: Pending | None, score_psi: float | None,
             chosen: tuple[str, Map] | None, fallback: str, binary: bool,
             level: float) -> Estimates:
    """One (series, window)'s estimates: through the chosen map, else ``fallback``
    (``live`` or ``raw``, whose sums ``pending`` already holds)."""
    if chosen is not None and pending is not None and pending.differs:
        chosen = None  # a decision other than the top label: the live calibrator, or raw
    if chosen is not None:
        basis, m = chosen
        fit_info: dict[str, Any] = {"estimate_basis": basis,
                                    "estimate_fit_samples": m.fit.samples,
                                    "estimate_fit_newest_ts": m.newest_ts}
        if pending is None:
            return Estimates(0, None, None, score_psi, **fit_info)
        r = read(m.fit, list(pending.sides), binary)
    else:
        fit_info = {"estimate_basis": fallback}
        if pending is None:
            return Estimates(0, None, None, score_psi, **fit_info)
        # the band of the Poisson-binomial count right, normal approximation: it holds
        # while the calibrator does (CBPE's assumption), not beyond
        r = Reading(pending.n, pending.top, pending.pos if binary else None, pending.var, 0.0)
    lower, upper = r.band(level)
    return Estimates(r.pending, r.accuracy, r.positive_rate, score_psi,
                     estimated_accuracy_lower=lower, estimated_accuracy_upper=upper,
                     estimated_correct=r.correct, estimated_correct_variance=r.variance,
                     **fit_info)
