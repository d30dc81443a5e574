"""The demo's story: every drift alarm folded per model, and followed to what happened.

A drift alarm says a series' calibration moved; what a newcomer wants to know is
what calmon does about it. Each drift line ends with where the series stands (still
collecting post-change samples, in its cooldown, waiting for its segments, refit due),
each refit outcome names the alarm it answers, and a publish of a model's calibrator
closes the alarms of its segments that it now serves. Alarms of one model raised in
one check are one line. ``open_lines`` says, on every status round, what the alarms
still open are waiting for, and ``summary`` what became of every alarm of the run.

Reads only what the recalibration loop publishes (its events and its policy's state
snapshot, both replaced whole by each check) and copies of the engine's buffers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.series import ALL
from calmon.recal.latch import TOO_FEW
from calmon.recal.policy import Event

SamplesOf = Callable[[str, str, int | None], SampleSet | None]
FOLD = 4  # segments named in a folded line; the rest are counted


@dataclass
class Alarm:
    ts: float  # event time of the drift event
    trigger: str
    change_ts: float | None
    nth: int  # 1 for the series' first alarm of the run, 2 for the next, ...
    outcome: str = ""  # what closed it ("" while open)
    tried: list[str] = field(default_factory=list)  # refits that did not close it


def _dur(seconds: float) -> str:
    """``21600`` -> ``6h``, ``10`` -> ``10 s``: as the config writes durations."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f} s"


def _name(model: str, segment: str) -> str:
    return f"{model}/{segment}"


def _fold(model: str, segments: list[str]) -> str:
    """``ctr/__all__ and 7 segments (country=US, ...)``."""
    segs = sorted(s for s in segments if s != ALL)
    head = [_name(model, ALL)] if ALL in segments else []
    if not segs:
        return head[0]
    shown = ", ".join(segs[:FOLD]) + (", ..." if len(segs) > FOLD else "")
    if not head:
        return _name(model, segs[0]) if len(segs) == 1 else (
            f"{model}: {len(segs)} segments ({shown})")
    return f"{head[0]} and {len(segs)} segment{'s' * (len(segs) > 1)} ({shown})"


def _refit_detail(f: dict[str, Any]) -> str:
    b, a = f.get("holdout_before") or {}, f.get("holdout_after") or {}
    out = f"{f.get('method')}"
    if "version" in f:
        out = f"v{f['version']} {out}"
    if b and a:
        out += (f", holdout ECE {b.get('ece', math.nan):.3f} -> {a.get('ece', math.nan):.3f},"
                f" NLL {b.get('nll', math.nan):.3f} -> {a.get('nll', math.nan):.3f}")
    return out


class Narrator:
    """Turns the loop's events into the demo's lines. ``state_of(model, segment)`` is
    the policy's published snapshot of a series (or None), ``samples_of`` and
    ``now_of`` the engine's."""

    def __init__(self, cfg: Config, state_of: Callable[[str, str], dict[str, Any] | None],
                 samples_of: SamplesOf, now_of: Callable[[str], float]) -> None:
        self.rc = cfg.recalibration
        ml = cfg.join.missing_label
        self.hold = 0.0 if ml is None else float(ml.after)
        self.state_of, self.samples_of, self.now_of = state_of, samples_of, now_of
        self.alarms: dict[tuple[str, str], list[Alarm]] = {}

    # ------------------------------------------------------------ events

    def lines(self, events: Iterable[Event]) -> list[str]:
        """The lines for one batch of fresh events (one or more checks' worth)."""
        out: list[str] = []
        drifts: dict[str, list[Event]] = {}
        for e in events:
            if e.kind == "drift":
                drifts.setdefault(e.model, []).append(e)
                n = len(self.alarms.get((e.model, e.segment), [])) + 1
                self.alarms.setdefault((e.model, e.segment), []).append(
                    Alarm(e.ts, str(e.fields.get("trigger")), e.fields.get("change_ts"), n))
        refitted = {(e.model, e.segment) for e in events if e.kind != "drift"}
        for model, evs in sorted(drifts.items()):
            out.append(self._drift_line(model, evs, refitted))
        for e in events:
            if e.kind != "drift":
                out += self._outcome_lines(e)
        return out

    def _drift_line(self, model: str, evs: list[Event],
                    refitted: set[tuple[str, str]]) -> str:
        first = min(evs, key=lambda e: (e.segment != ALL, e.segment))
        again = [e for e in evs if self.alarms[(e.model, e.segment)][-1].nth > 1]
        ch = first.fields.get("change_ts")
        ago = f", change estimated {first.ts - ch:.0f} s earlier" if ch is not None else ""
        what = _fold(model, [e.segment for e in evs])
        note = " (again)" if len(again) == len(evs) else (
            f" ({len(again)} again)" if again else "")
        now = ("refitted at once (below)" if (first.model, first.segment) in refitted
               else self.progress(first.model, first.segment))
        return f"  >> drift {what}{note}: {first.fields.get('trigger')}{ago}; {now}"

    def _outcome_lines(self, e: Event) -> list[str]:
        where, f = _name(e.model, e.segment), e.fields
        open_ = self._open(e.model, e.segment)
        answers = (f" (for the drift of {_dur(e.ts - open_.ts)} ago)"
                   if open_ and e.ts - open_.ts >= 1 else "")
        if e.kind == "published":
            rollback = " (rollback)" if f.get("trigger") == "rollback" else ""
            line = f"  >> {where}: refit published{rollback}: {_refit_detail(f)}{answers}"
            if open_:
                open_.outcome = f"published v{f.get('version')}"
            lines = [line]
            if e.segment == ALL:  # its segments are now tested against the new calibrator
                served = [s for (m, s), alarms in self.alarms.items()
                          if m == e.model and s != ALL and alarms[-1].outcome == ""
                          and not self._own_calibrator(m, s)]
                for s in served:
                    self.alarms[(e.model, s)][-1].outcome = (
                        f"served by {e.model}/{ALL} v{f.get('version')}")
                if served:
                    lines.append(f"     {_fold(e.model, served)}: now served by this "
                                 "calibrator, their alarms closed (each is tested afresh "
                                 "against it)")
            return lines
        if e.kind == "held":
            detail = f"psi {f.get('psi')}" if f.get("psi") is not None else f.get("reason")
            if open_:
                open_.tried.append("held")
            return [f"  >> {where}: refit held: newer predictions moved from its fit data "
                    f"({detail}){answers}"]
        reason = f.get("reason") or "?"
        if open_:
            open_.tried.append(f"{e.kind} ({reason})")
        if reason == TOO_FEW:  # the latch let go: a refit comes once the samples do
            then = (f"; a refit is tried once {self.rc.min_samples} post-change samples "
                    "have accrued")
        elif e.kind == "rejected":
            then = (f"; retried when its post-change samples double or after "
                    f"{_dur(self.rc.retry_after)}")
        else:
            then = f"; tried again after the cooldown ({_dur(self.rc.cooldown)})"
        return [f"  >> {where}: refit {e.kind}: {reason}{then}{answers}"]

    def _open(self, model: str, segment: str) -> Alarm | None:
        alarms = self.alarms.get((model, segment))
        return alarms[-1] if alarms and not alarms[-1].outcome else None

    def _own_calibrator(self, model: str, segment: str) -> bool:
        st = self.state_of(model, segment)
        return st is not None and st.get("basis", [None])[0] is not None

    # ------------------------------------------------------------ where a series stands

    def progress(self, model: str, segment: str) -> str:
        """What an alarmed series waits for, as of the last check."""
        st = self.state_of(model, segment)
        if st is None:
            return "refit due at the next check"
        if not st.get("drifting"):
            return "its triggers no longer fire: nothing to refit"
        now = self.now_of(model)
        n = self._post_change(model, segment, st, now)
        last, m = st.get("last_refit"), self.rc.min_samples
        if st.get("rejections"):
            need = 2 * int(st.get("last_n", 0))
            return (f"after a rejected refit: retried at {need} post-change samples (has {n}) "
                    f"or after {_dur(self.rc.retry_after)}")
        if last is not None and now - last < self.rc.cooldown:
            return f"in its cooldown for {_dur(round(self.rc.cooldown - (now - last)))} more"
        if n < m:
            return f"still collecting post-change samples: {n} of {m}"
        if segment == ALL and self.rc.per_segment:
            return ("the drift looks local to some segments: they are refitted on their own "
                    "and the model-wide calibrator waits")
        return "refit due at the next check"

    def _post_change(self, model: str, segment: str, st: dict[str, Any], now: float) -> int:
        """The samples a refit would fit on: predicted since the estimated change (and
        since the live calibrator's fit), their labels settled."""
        every = self.samples_of(model, segment, None)
        if every is None or not len(every):
            return 0
        origin = (st.get("detector") or {}).get("origin")
        since = max(x for x in (st.get("change_ts"), origin, -math.inf) if x is not None)
        return int(((every.ts >= since) & (every.ts <= now - self.hold)).sum())

    def open_lines(self) -> list[str]:
        """One line per model with open alarms: what each is waiting for (folded)."""
        by_model: dict[str, dict[str, list[str]]] = {}
        for (m, s), alarms in sorted(self.alarms.items()):
            if alarms[-1].outcome:
                continue
            by_model.setdefault(m, {}).setdefault(self.progress(m, s), []).append(s)
        out = []
        for m, states in by_model.items():
            for state, segs in states.items():
                out.append(f"  .. open: {_fold(m, segs)}: {state}")
        return out

    def summary(self) -> list[str]:
        """What became of every alarm of the run, one line per series."""
        if not self.alarms:
            return ["no drift alarm this run"]
        out = ["what became of each drift alarm:"]
        for (m, s), alarms in sorted(self.alarms.items()):
            fates = []
            for a in alarms:
                tried = f" after {', '.join(a.tried)}" if a.tried else ""
                fates.append(f"{a.outcome}{tried}" if a.outcome
                             else f"open{tried}: {self.progress(m, s)}")
            out.append(f"  {_name(m, s)}: " + "; then ".join(fates))
        return out
