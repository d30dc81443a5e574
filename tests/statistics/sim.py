"""Simulated streams with a known truth, driven through the daemon's policy.

Every sample has a TRUE probability (its label is drawn from it), so the true ECE of
any calibrator is computed without label noise: bin the calibrated outputs on fresh
samples and compare each bin's mean output with the mean true probability. Nothing
here uses calmon's metrics; the policy under test is calmon.recal.policy.Policy, fed
through the engine's own sample rings (calmon.engine.buffer) as the daemon feeds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit, logit, softmax

from calmon import config as config_mod
from calmon.config import Config
from calmon.engine.buffer import Buffers, SampleSet
from calmon.engine.series import ALL
from calmon.recal.policy import Event, Policy
from calmon.recal.registry import Registry

DAY = 86_400.0
T0 = 1_764_460_800.0  # 2025-11-30T00:00:00Z
BINS = 15


def sim_config(tmp: Path | None = None, *, classwise: bool = False,
               join: dict[str, Any] | None = None,
               slices: list[list[str]] | None = None, max_values: int = 50,
               **recal: Any) -> Config:
    base: dict[str, Any] = {
        "interval": "5m", "cooldown": "1h", "min_samples": 1000, "alpha": 0.01,
        "method": "temperature", "buffer": 50_000, "window": "24h",
        "output_dir": str(tmp or "/nonexistent"),
    }
    base.update(recal)
    return config_mod.from_dict({
        "metrics": {"bins": BINS, "windows": ["1h", "24h"], "classwise": classwise},
        "segments": {"slices": slices or [["country"]], "max_values": max_values},
        "recalibration": base,
        **({"join": join} if join else {}),
    })


# A scenario maps (t, segment index, n, rng) -> (reported scores, true probabilities):
# binary scores are logits (n,), multiclass logits (n, K); true probabilities are
# P(y=1) (n,) or the full class distribution (n, K).
Scenario = Callable[[float, int, int, np.random.Generator], tuple[np.ndarray, np.ndarray]]


def binary(mu: float = -3.5, sd: float = 1.0, change_at: float = np.inf,
           scale: float = 1.0, shift: float = 0.0, shift_segment: int | None = None
           ) -> Scenario:
    """True logit z ~ N(mu, sd). After ``change_at`` the model reports z * scale (2.5:
    over-confident, 0.5: under-confident); with ``shift`` the truth becomes z + shift
    (a prior shift), only in ``shift_segment`` when given."""

    def draw(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(mu, sd, n)
        after = t >= change_at
        reported = z * scale if after else z
        hit = after and (shift_segment is None or seg == shift_segment)
        return reported, expit(z + shift if hit else z)

    return draw


def multiclass(k: int = 4, sd: float = 1.5, change_at: float = np.inf,
               scale: float = 1.0) -> Scenario:
    def draw(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(0.0, sd, (n, k))
        return (z * scale if t >= change_at else z), softmax(z, axis=1)

    return draw


def prior_shift(k: int = 5, sd: float = 1.5, change_at: float = np.inf, shift: float = 2.0,
                cls: int = 0, scale: float = 1.0) -> Scenario:
    """A K-class model whose logits z ~ N(0, sd) are calibrated until ``change_at``; then
    the truth becomes softmax(z + shift e_cls) (a class-prior shift: the model's logits
    do not change) and the model reports z * scale (0.5: turned under-confident)."""

    def draw(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(0.0, sd, (n, k))
        if t < change_at:
            return z, softmax(z, axis=1)
        return z * scale, softmax(z + shift * np.eye(k)[cls], axis=1)

    return draw


def draw_labels(truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if truth.ndim == 1:
        return (rng.random(len(truth)) < truth).astype(np.int64)
    u = rng.random(len(truth))
    return np.minimum((np.cumsum(truth, axis=1) < u[:, None]).sum(axis=1),
                      truth.shape[1] - 1)


def true_ece(cal: Any, scores: np.ndarray, truth: np.ndarray, bins: int = BINS) -> float:
    """ECE of ``cal`` (None: the raw model) against the true probabilities."""
    if scores.ndim == 1:
        out = expit(scores) if cal is None else cal.apply(scores)
        conf, target = out, truth
    else:
        out = softmax(scores, axis=1) if cal is None else cal.apply(scores)
        top = out.argmax(axis=1)
        conf = out[np.arange(len(out)), top]
        target = truth[np.arange(len(out)), top]
    b = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            total += abs(conf[m].sum() - target[m].sum())
    return total / len(conf)


def true_classwise_ece(cal: Any, scores: np.ndarray, truth: np.ndarray,
                       bins: int = BINS) -> float:
    """Mean over classes of the ECE of p_k against the TRUE P(y = k) (None: raw model)."""
    out = softmax(scores, axis=1) if cal is None else cal.apply(scores)
    per = []
    for c in range(out.shape[1]):
        conf, target = out[:, c], truth[:, c]
        b = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
        per.append(np.abs(np.bincount(b, conf, bins) - np.bincount(b, target, bins)).sum()
                   / len(conf))
    return float(np.mean(per))


@dataclass
class Run:
    events: list[Event] = field(default_factory=list)
    policy: Policy | None = None
    max_evidence: dict[tuple[str, str], float] = field(default_factory=dict)

    def of(self, kind: str, segment: str | None = None) -> list[Event]:
        return [e for e in self.events if e.kind == kind
                and (segment is None or e.segment == segment)]


# (labels, rng) -> each label's delay in seconds after its prediction
Delay = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def uniform_delay(lo: float, hi: float) -> Delay:
    return lambda y, rng: rng.uniform(lo, hi, len(y))


class Simulation:
    """Samples per segment at a fixed daily rate, checked every ``interval`` of event
    time; per_segment fans each sample out as the engine does. Labels come at once, or
    ``delay`` after their prediction: a sample joins the rings (in label-arrival order,
    with its prediction time) once its label has arrived. Each check names the series
    whose rings gained samples since the previous one (``check_each(new=...)``, as replay
    does): the policy passes over the others unread (calmon.recal.skip.Untouched), which
    changes no outcome and saves the idle checks of a many-series run.

    ``shares``: each segment's share of ``per_day`` (then the model's total; without it
    ``per_day`` is every segment's own rate). ``members``: the series names each segment
    feeds besides ``__all__`` (default ``country=c<i>``; e.g. ``["country=c1",
    "device=d0"]`` for two slices). ``record``: keep every sample drawn (``drawn()``),
    for the oracles. ``readers``: the policy publishes what readers see (gauges,
    snapshot) after every check, as the daemon's does, and ``Run.max_evidence`` is kept;
    without it, as in replay (``readers_each_check`` off), which no decision reads."""

    def __init__(self, cfg: Config, scenario: Scenario, segments: int, per_day: float,
                 seed: int, model: str = "m", registry: Registry | None = None,
                 delay: Delay | None = None, *, shares: np.ndarray | None = None,
                 members: list[list[str]] | None = None, record: bool = False,
                 reseed: tuple[float, int] | None = None, readers: bool = False) -> None:
        self.cfg = cfg
        self.scenario = scenario
        self.segments = segments
        rates = (np.full(segments, float(per_day)) if shares is None
                 else float(per_day) * np.asarray(shares, dtype=np.float64))
        self.per_check = rates * cfg.recalibration.interval / DAY  # per segment
        self.rng = np.random.default_rng(seed)
        self.model = model
        self.buffers = Buffers(cfg.recalibration.buffer)
        self.policy = Policy(cfg, registry or Registry(None))
        self.members = members or [[f"country=c{i}"] for i in range(segments)]
        self.names = list(dict.fromkeys(n for ms in self.members for n in ms))
        self._sid = {name: i + 1 for i, name in enumerate(self.names)}
        self._member_sids = [[self._sid[n] for n in ms] for ms in self.members]
        self.t = T0
        self._carry = np.zeros(segments)
        self.delay = delay
        # labelled samples waiting for their label: (arrival, seg, ts, label, kind, score)
        self._pending: list[tuple[np.ndarray, ...]] = []
        self.record = record
        self._sequential = shares is None and members is None
        # (t, seed): from the first check at or after t the draws restart from this seed,
        # so runs that differ only before t see the same stream after it (paired runs)
        self.reseed = reseed
        self._drawn: list[tuple[np.ndarray, ...]] = []  # (ts, arrival, seg, label, score, truth)
        # per check and segment: (check start, segment, bin counts of the raw confidences
        # of the predictions drawn in that check interval), labelled or not, for the
        # policy's holds, as the daemon's engine keeps them (in buckets of event time)
        self._hist: list[tuple[float, int, np.ndarray]] = []
        self.policy.scores_of = self.scores_since
        self.policy.readers_each_check = self.readers = readers
        self._new: set[tuple[str, str]] = set()  # series whose rings gained samples

    def samples_of(self, model: str, segment: str, last: int | None = None
                   ) -> SampleSet | None:
        sid = 0 if segment == ALL else self._sid[segment]
        return self.buffers.samples(sid, last)

    def series(self) -> list[tuple[str, str]]:
        keys = [(self.model, ALL)]
        if self.cfg.recalibration.per_segment:
            keys += [(self.model, s) for s in self.names]
        return keys

    def run(self, days: float, on_check: Callable[[Simulation, list[Event]], None] | None = None
            ) -> Run:
        """Simulate ``days`` more; ``on_check(sim, events)`` after every check."""
        out = Run(policy=self.policy)
        interval = self.cfg.recalibration.interval
        end = self.t + days * DAY
        while self.t < end - 1e-6:
            if self.reseed is not None and self.t >= self.reseed[0]:
                self.rng = np.random.default_rng(self.reseed[1])
                self._carry[:] = 0.0
                self.reseed = None
            # the original scenarios draw segment by segment (their seeds' streams); the
            # new ones draw every segment's count at once
            counts = None if self._sequential else self.rng.poisson(self.per_check)
            drawn: list[tuple[int, np.ndarray]] = []  # (segment, scores) of this interval
            for seg in range(self.segments):
                self._carry[seg] += (self.rng.poisson(self.per_check[seg]) if counts is None
                                     else counts[seg])
                n = int(self._carry[seg])
                if n == 0:
                    continue
                self._carry[seg] -= n
                ts = np.sort(self.t + self.rng.random(n) * interval)
                scores, truth = self.scenario(self.t, seg, n, self.rng)
                labels = draw_labels(truth, self.rng)
                kind = np.full(n, 1 if scores.ndim == 1 else 3, np.int8)
                arrival = ts if self.delay is None else ts + self.delay(labels, self.rng)
                self._pending.append((arrival, np.full(n, seg), ts, labels, kind, scores))
                if self.record:
                    self._drawn.append((ts, arrival, np.full(n, seg), labels, scores, truth))
                drawn.append((seg, scores))
            self._hist += [(self.t, seg, h) for seg, h in _conf_hists(drawn)]
            self._deliver(self.t + interval)
            self.t += interval
            new, self._new = self._new, set()
            events = self.policy.check_each(lambda _model, t=self.t: t, self.series(),
                                            self.samples_of, new=new)
            out.events += events
            for key, v in (self.policy.gauges.evidence.items() if self.readers else ()):
                out.max_evidence[key] = max(out.max_evidence.get(key, 0.0), v)
            if on_check is not None:
                on_check(self, events)
        return out

    def drawn(self) -> dict[str, np.ndarray]:
        """Every sample drawn so far (``record=True``): ts, arrival, seg, label, score,
        truth, in drawing order."""
        names = ("ts", "arrival", "seg", "label", "score", "truth")
        if not self._drawn:
            return {n: np.zeros(0) for n in names}
        return {n: np.concatenate(c) for n, c in zip(names, zip(*self._drawn))}

    def scores_since(self, model: str, segment: str, since: float) -> np.ndarray:
        """Bin counts of the raw confidences of the predictions made in the check
        intervals that start at or after ``since``, labelled or not: what the daemon's
        engine gives ``Policy.scores_of`` (its buckets are a window / 16 of event time;
        the one holding ``since`` is left out there too)."""
        mine = None if segment == ALL else {
            i for i, ms in enumerate(self.members) if segment in ms}
        out = np.zeros(BINS, np.int64)
        for t, seg, counts in reversed(self._hist):
            if t < since:
                break
            if mine is None or seg in mine:
                out += counts
        return out

    def _deliver(self, until: float) -> None:
        """Add every sample whose label arrived before ``until``, in arrival order."""
        if not self._pending:
            return
        cols = [np.concatenate(c) for c in zip(*self._pending)]
        arrival, seg, ts, labels, kind, scores = cols
        due = arrival < until
        rest = [c[~due] for c in cols]
        self._pending = [tuple(rest)] if len(rest[0]) else []
        order = np.argsort(arrival[due], kind="stable")
        seg, ts, labels, kind, scores = (c[due][order] for c in (seg, ts, labels, kind, scores))
        if not len(ts):
            return
        classes = 0 if scores.ndim == 1 else scores.shape[1]
        self.buffers.add(0, classes, ts, labels, kind, scores)
        self._new.add((self.model, ALL))
        if self.cfg.recalibration.per_segment:
            per_sid: dict[int, list[np.ndarray]] = {}
            for s in np.unique(seg).tolist():
                for sid in self._member_sids[s]:
                    per_sid.setdefault(sid, []).append(np.flatnonzero(seg == s))
            for sid, parts in sorted(per_sid.items()):
                m = np.sort(np.concatenate(parts))  # arrival order within the series
                self.buffers.add(sid, classes, ts[m], labels[m], kind[m], scores[m])
                self._new.add((self.model, self.names[sid - 1]))

    def fresh(self, t: float, seg: int, n: int, seed: int = 99) -> tuple[np.ndarray, np.ndarray]:
        """Fresh samples of the scenario at time t: (reported scores, true probabilities)."""
        return self.scenario(t, seg, n, np.random.default_rng(seed))


def _conf_hist(scores: np.ndarray) -> np.ndarray:
    """BINS equal-width right-closed bin counts of the raw confidence (binary P(y=1),
    multiclass top label) of these scores (logits)."""
    p = probs_of(scores)
    conf = p if p.ndim == 1 else p.max(axis=1)
    return np.bincount(np.clip(np.ceil(conf * BINS).astype(int) - 1, 0, BINS - 1),
                       minlength=BINS)


def _conf_hists(drawn: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """``_conf_hist`` of each segment's scores, one probability transform and one
    bincount for all (row by row the same confidences, so the same counts)."""
    if len({s.shape[1:] for _, s in drawn}) != 1:  # none, or binary and multiclass
        return [(seg, _conf_hist(s)) for seg, s in drawn]
    p = probs_of(np.concatenate([s for _, s in drawn]))
    conf = p if p.ndim == 1 else p.max(axis=1)
    b = np.clip(np.ceil(conf * BINS).astype(int) - 1, 0, BINS - 1)
    b += BINS * np.repeat(np.arange(len(drawn)), [len(s) for _, s in drawn])
    counts = np.bincount(b, minlength=BINS * len(drawn)).reshape(len(drawn), BINS)
    return [(seg, counts[i]) for i, (seg, _) in enumerate(drawn)]


def logit_of(p: np.ndarray) -> np.ndarray:
    return logit(np.clip(p, 1e-12, 1 - 1e-12))


# ---------------------------------------------------------------- oracles


def log_lr_truth(claimed: np.ndarray, truth: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample log-likelihood ratio of the TRUE probabilities against the claimed
    ones (binary P(y=1) (n,), or class distributions (n, K)) at the drawn labels."""
    if truth.ndim == 1:
        t = np.where(labels == 1, truth, 1.0 - truth)
        c = np.where(labels == 1, claimed, 1.0 - claimed)
    else:
        rows = np.arange(len(labels))
        t, c = truth[rows, labels], claimed[rows, labels]
    return np.log(np.clip(t, 1e-300, None)) - np.log(np.clip(c, 1e-300, None))


def sprt_samples(claimed: np.ndarray, truth: np.ndarray, labels: np.ndarray,
                 alpha: float = 0.01) -> int | None:
    """The SPRT oracle: how many of these samples (in the order given) the known
    alternative's likelihood ratio needs to reach 1/alpha; None if it never does."""
    hit = np.flatnonzero(np.cumsum(log_lr_truth(claimed, truth, labels)) >= np.log(1 / alpha))
    return int(hit[0]) + 1 if len(hit) else None


def probs_of(scores: np.ndarray) -> np.ndarray:
    """The model's own probabilities of logits (binary (n,), multiclass (n, K))."""
    return expit(scores) if scores.ndim == 1 else softmax(scores, axis=1)


def post_change(d: dict[str, np.ndarray], change: float, by: float,
                segs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The drawn samples predicted at or after ``change`` whose label had arrived before
    ``by`` (what a check at ``by`` had read), in arrival order; only segments ``segs``
    when given."""
    m = (d["ts"] >= change) & (d["arrival"] < by)
    if segs is not None:
        m &= np.isin(d["seg"], segs)
    order = np.argsort(d["arrival"][m], kind="stable")
    return {k: v[m][order] for k, v in d.items()}
