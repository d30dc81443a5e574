"""``calmon replay --html FILE``: a self-contained report of a replay (no scripts, no links).

Per model: the reliability diagram of its raw scores and, after a
``--recalibrate`` backtest, of the calibrator live at the end (on samples
predicted after its fit only), each over a histogram of the confidences; the
estimated accuracy (what the model's own confidence, after the calibrator live
then, promises) against the realized accuracy over event time; and its
segments, worst first. After a backtest, the drift and refit events of each model
(marked on its accuracy-over-time plot too), and what the backtest did where no
calibrator is shown. A legend names every mark. Inline SVG, so the file opens
anywhere and can be attached to a ticket.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calmon.calibrators.scores import to_probs
from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.engine import Engine
from calmon.engine.metrics import bins_from_samples, confidence_and_correct, ece
from calmon.engine.rows import Row, Snapshot
from calmon.engine.snapshot import full_snapshot
from calmon.io.reliability import within_noise
from calmon.report_periods import periods_section

if TYPE_CHECKING:
    from calmon.periods import PeriodRow
    from calmon.recal.policy import Event

W, H, PAD = 260, 260, 34  # a diagram's plot area and margin, in px
HIST_H = 60
SERIES_PER_MODEL = 12  # segments shown per model, worst ECE first
TIME_BUCKETS = 24
Apply = Callable[[np.ndarray, str], np.ndarray]  # (scores, score kind) -> probabilities


@dataclass(frozen=True)
class Curve:
    count: np.ndarray
    conf: np.ndarray
    correct: np.ndarray

    @property
    def ece(self) -> float | None:
        return ece(self.count, self.conf, self.correct) if self.count.sum() > 0 else None


def write_report(cfg: Config, engine: Engine, out: Path,
                 calibrators: dict[tuple[str, str], tuple[Apply, float | None]] | None = None,
                 title: str = "calmon replay", snapshot: Snapshot | None = None,
                 events: Sequence[Event] | None = None,
                 periods: Sequence[PeriodRow] | None = None) -> None:
    """Write the report of ``engine``'s final state to ``out``. ``calibrators``:
    (model, segment) -> (apply, fitted_at event time) of the calibrators live at the end.
    ``snapshot``: the statistics of that state, as ``replay`` prints them (default:
    read now). ``events``: a backtest's (``replay --recalibrate``), None when the
    replay ran no policy. ``periods``: the rows of ``replay --every``, drawn over the
    periods."""
    view = snapshot if snapshot is not None else full_snapshot(engine)
    calibrators = calibrators or {}
    largest = max(cfg.metrics.windows, key=lambda w: w.seconds).name
    rows = [r for r in view.rows if r.window == largest and r.stats.samples > 0]
    models = sorted({r.model for r in rows})
    head, legend = _HEAD.format(title=html.escape(title)), _LEGEND
    if periods is not None:
        head = head.replace("</style>", _PERIOD_CSS + "</style>")
        legend = legend[:-len("</div>")] + _PERIOD_KEYS + "</div>"
    parts = [head,
             f"<h1>{html.escape(title)}</h1>",
             f"<p class=note>Window {html.escape(largest)}; "
             f"{view.counters.get('joined', 0)} joined samples, "
             f"{view.counters.get('invalid', 0)} invalid records. Bins: {cfg.metrics.bins} "
             "equal-width, right-closed. Estimated accuracy assumes the calibrator holds "
             "(exact under covariate shift, wrong under concept shift).</p>",
             legend]
    if not models:
        parts.append("<p>No joined samples.</p>")
    for model in models:
        mine = [r for r in rows if r.model == model]
        mine_events = None if events is None else [e for e in events if e.model == model]
        parts.append(_model_section(cfg, engine, model, mine, calibrators, mine_events))
    if periods is not None:
        parts.append(periods_section(periods, SERIES_PER_MODEL))
    parts.append("</body></html>\n")
    out.write_text("\n".join(parts), encoding="utf-8")


def _model_section(cfg: Config, engine: Engine, model: str, rows: list[Row],
                   calibrators: dict[tuple[str, str], tuple[Apply, float | None]],
                   events: list[Event] | None) -> str:
    bins = cfg.metrics.bins
    cal = calibrators.get((model, "__all__"))
    top = next((r for r in rows if r.segment == "__all__"), rows[0])
    raw = Curve(top.stats.bins.count, top.stats.bins.conf, top.stats.bins.correct)
    out = [f"<section><h2>{html.escape(model)}</h2>",
           f"<p>{top.stats.samples} samples; ECE {_f(top.stats.ece)} "
           f"(noise floor {_f(top.stats.noise_floor)}), interval "
           f"[{_f(top.stats.ece_lower)}, {_f(top.stats.ece_upper)}]</p><div class=row>",
           _diagram("raw scores", raw)]
    samples = engine.samples(model, "__all__")
    if cal is not None and samples is not None and len(samples):
        apply, fitted = cal
        after = samples if fitted is None else samples.select(samples.ts > fitted)
        if len(after):
            conf, correct = confidence_and_correct(_apply(apply, after), after.label)
            b = bins_from_samples(conf, correct, bins)
            cal_ece = ece(b.count, b.conf, b.correct)
            noise = within_noise(cal_ece, (top.stats.ece_lower, top.stats.ece_upper))
            out.append(_diagram(f"calibrated ({len(after)} samples after its fit): ECE "
                                f"{_f(cal_ece)}{noise}", Curve(b.count, b.conf, b.correct)))
    else:
        out.append(f"<figure class=empty><figcaption>{_no_calibrator(model, events, calibrators)}"
                   "</figcaption></figure>")
    if samples is not None and len(samples) >= 2:
        out.append(_accuracy_over_time(samples, cal, events or [],
                                       cfg.model(model).threshold or 0.5))
    out.append("</div>")
    if events is not None:
        out.append(_events_table(events))
    segs = sorted((r for r in rows if r.segment != "__all__"),
                  key=lambda r: -(r.stats.ece or 0.0))[:SERIES_PER_MODEL]
    if segs:
        out.append("<h3>Segments, worst ECE first</h3><div class=row>")
        for r in segs:
            own = " (own calibrator)" if (model, r.segment) in calibrators else ""
            out.append(_diagram(f"{r.segment}{own}: n={r.stats.samples}, ECE {_f(r.stats.ece)}",
                                Curve(r.stats.bins.count, r.stats.bins.conf,
                                      r.stats.bins.correct)))
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def _no_calibrator(model: str, events: list[Event] | None,
                   calibrators: dict[tuple[str, str], tuple[Apply, float | None]]) -> str:
    """Why there is no model-wide calibrated diagram, true to what was run."""
    if events is None:
        return "no calibrator (replay ran no recalibration: --recalibrate backtests one)"
    own = sorted(s for m, s in calibrators if m == model and s != "__all__")
    segs = (f"; per segment: {html.escape(', '.join(own))} (below)" if own else "")
    mine = [e for e in events if e.segment == "__all__"]
    if not mine:
        return ("no model-wide calibrator: the backtest raised no drift alarm on the whole "
                f"model{segs}")
    last = mine[-1]
    if last.kind == "drift":
        return (f"no model-wide calibrator: drift at {_when(last.ts)}, no refit by the end "
                f"of the data (too few post-change samples, or waiting for its segments)"
                f"{segs}")
    why = html.escape(str(last.fields.get("reason") or last.kind))
    return f"no model-wide calibrator: the last refit was {last.kind} ({why}){segs}"


def _events_table(events: list[Event]) -> str:
    if not events:
        return "<p class=note>Backtest events: none (no drift alarm).</p>"
    rows = []
    for e in events:
        f = e.fields
        if e.kind == "drift":
            ch = f.get("change_ts")
            detail = (f"trigger {f.get('trigger')}"
                      + (f", change estimated at {_when(ch)}" if ch is not None else ""))
        else:
            detail = str(f.get("method") or "")
            if "version" in f:
                detail += f" v{f['version']}"
            b, a = f.get("holdout_before") or {}, f.get("holdout_after") or {}
            if b and a:
                detail += (f", holdout ECE {_f(b.get('ece'))} &rarr; {_f(a.get('ece'))}, "
                           f"NLL {_f(b.get('nll'))} &rarr; {_f(a.get('nll'))}")
            if f.get("reason"):
                detail += f" ({html.escape(str(f['reason']))})"
        rows.append(f"<tr class={e.kind}><td>{_when(e.ts)}</td><td>{html.escape(e.segment)}"
                    f"</td><td>{e.kind}</td><td>{detail}</td></tr>")
    return ("<h3>Backtest events</h3><table class=events><tr><th>event time</th>"
            "<th>segment</th><th>event</th><th>what</th></tr>" + "".join(rows) + "</table>")


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _diagram(caption: str, c: Curve) -> str:
    """Reliability diagram (bars: accuracy per bin, line: the diagonal) over a histogram."""
    b = len(c.count)
    n = c.count.sum()
    bw = W / b
    parts = [f'<svg width="{W + 2 * PAD}" height="{H + HIST_H + 2 * PAD + 10}" '
             f'role="img" aria-label="{html.escape(caption)}">',
             f'<g transform="translate({PAD},{PAD})">',
             f'<rect width="{W}" height="{H}" class=frame />',
             f'<line x1="0" y1="{H}" x2="{W}" y2="0" class=diag />']
    peak = max(float(c.count.max()), 1.0)
    for i in range(b):
        if c.count[i] <= 0:
            continue
        acc = c.correct[i] / c.count[i]
        conf = c.conf[i] / c.count[i]
        x = i * bw
        parts.append(f'<rect x="{x:.1f}" y="{H * (1 - acc):.1f}" width="{bw - 1:.1f}" '
                     f'height="{H * acc:.1f}" class=bar><title>bin {i}: n={int(c.count[i])}, '
                     f'confidence {conf:.3f}, accuracy {acc:.3f}</title></rect>')
        parts.append(f'<circle cx="{W * conf:.1f}" cy="{H * (1 - acc):.1f}" r="2.5" class=pt />')
        hh = HIST_H * c.count[i] / peak
        parts.append(f'<rect x="{x:.1f}" y="{H + 10 + HIST_H - hh:.1f}" width="{bw - 1:.1f}" '
                     f'height="{hh:.1f}" class=hist />')
    parts += [f'<text x="0" y="-8">{html.escape(caption)}</text>',
              f'<text x="{W}" y="{H + HIST_H + 26}" text-anchor="end">confidence '
              f'(n={int(n)}, ECE {_f(c.ece)})</text>',
              f'<text x="-6" y="{H}" text-anchor="end">0</text>',
              '<text x="-6" y="10" text-anchor="end">1</text>',
              "</g></svg>"]
    return f"<figure>{''.join(parts)}</figure>"


def _accuracy_over_time(s: SampleSet, cal: tuple[Apply, float | None] | None,
                        events: Sequence[Event] = (), threshold: float = 0.5) -> str:
    """Realized accuracy per time bucket against the accuracy the model's own confidence
    promises for its predicted class, after the calibrator from its fit on (raw before:
    what calmon estimated live); the model-wide drift alarms and publishes marked. Binary
    decisions at ``models.<m>.threshold`` (the refit buffer keeps no per-record decision)."""
    raw_probs = _apply(to_probs, s)  # the model's own (sigmoid / softmax of logits)
    probs = raw_probs
    if cal is not None:
        after = s.ts > (cal[1] if cal[1] is not None else -math.inf)
        probs = np.where(after if raw_probs.ndim == 1 else after[:, None],
                         _apply(cal[0], s), raw_probs)
    if raw_probs.ndim == 1:
        pred = (raw_probs >= threshold).astype(np.int64)
        est = np.where(pred == 1, probs, 1.0 - probs)
    else:
        pred = raw_probs.argmax(axis=1)
        est = probs[np.arange(len(pred)), pred]
    real = (pred == s.label).astype(np.float64)
    lo, hi = float(s.ts.min()), float(s.ts.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, TIME_BUCKETS + 1)
    idx = np.clip(np.searchsorted(edges, s.ts, side="right") - 1, 0, TIME_BUCKETS - 1)
    n = np.bincount(idx, minlength=TIME_BUCKETS)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.bincount(idx, est, minlength=TIME_BUCKETS) / n
        r = np.bincount(idx, real, minlength=TIME_BUCKETS) / n
    vals = np.concatenate([e[n > 0], r[n > 0]])
    ymin, ymax = float(np.floor(vals.min() * 20) / 20), float(np.ceil(vals.max() * 20) / 20)
    ymax = ymax if ymax > ymin else ymin + 0.05

    def line(y: np.ndarray, cls: str) -> str:
        pts = " ".join(f"{W * (i + 0.5) / TIME_BUCKETS:.1f},"
                       f"{H * (1 - (y[i] - ymin) / (ymax - ymin)):.1f}"
                       for i in range(TIME_BUCKETS) if n[i] > 0)
        return f'<polyline points="{pts}" class={cls} />'

    span = (hi - lo) if hi > lo else 1.0
    marks = "".join(
        f'<line x1="{W * (e.ts - lo) / span:.1f}" y1="0" x2="{W * (e.ts - lo) / span:.1f}" '
        f'y2="{H}" class=ev-{e.kind}><title>{e.kind} at {_when(e.ts)}</title></line>'
        for e in events if e.segment == "__all__" and e.kind in ("drift", "published")
        and lo <= e.ts <= hi)
    start = datetime.fromtimestamp(lo, UTC).strftime("%Y-%m-%d %H:%M")
    end = datetime.fromtimestamp(hi, UTC).strftime("%Y-%m-%d %H:%M")
    cap = "accuracy over time: estimated (dashed) vs realized"
    return (f'<figure><svg width="{W + 2 * PAD}" height="{H + 2 * PAD + 10}" role="img" '
            f'aria-label="{cap}"><g transform="translate({PAD},{PAD})">'
            f'<rect width="{W}" height="{H}" class=frame />{marks}{line(r, "real")}'
            f'{line(e, "est")}'
            f'<text x="0" y="-8">{cap}</text>'
            f'<text x="-6" y="{H}" text-anchor="end">{ymin:.2f}</text>'
            f'<text x="-6" y="10" text-anchor="end">{ymax:.2f}</text>'
            f'<text x="0" y="{H + 16}">{start}</text>'
            f'<text x="{W}" y="{H + 16}" text-anchor="end">{end}</text></g></svg></figure>')


def _apply(apply: Apply, s: SampleSet) -> np.ndarray:
    """``apply`` over samples of mixed score kinds, one call per kind."""
    from calmon.engine.records import SCORE_KINDS

    out = np.zeros(s.score.shape)
    for k in np.unique(s.kind):
        rows = s.kind == k
        out[rows] = apply(s.score[rows], SCORE_KINDS[int(k)])
    return out


def _f(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"


_HEAD = """<!doctype html><html lang=en><head><meta charset=utf-8>
<title>{title}</title><style>
body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}
section{{border-top:1px solid #ccc;margin-top:18px}}
.row{{display:flex;flex-wrap:wrap;gap:8px}} figure{{margin:0}}
.note{{color:#555;max-width:60em}} text{{font-size:11px;fill:#333}}
.frame{{fill:#fafafa;stroke:#999}} .diag{{stroke:#999;stroke-dasharray:4 3}}
.bar{{fill:#4c78a8;fill-opacity:.75}} .pt{{fill:#e45756}} .hist{{fill:#9d9d9d}}
.real{{fill:none;stroke:#4c78a8;stroke-width:2}}
.est{{fill:none;stroke:#e45756;stroke-width:2;stroke-dasharray:5 3}}
figure.empty{{width:320px;color:#777;padding:40px 0}}
.ev-drift{{stroke:#f58518;stroke-width:1.5;stroke-dasharray:3 2}}
.ev-published{{stroke:#54a24b;stroke-width:2}}
table.events{{border-collapse:collapse;margin:6px 0}}
table.events td,table.events th{{padding:2px 8px;text-align:left;border-bottom:1px solid #eee}}
.legend{{display:flex;flex-wrap:wrap;gap:4px 16px;color:#444;margin:8px 0}}
.legend span{{display:inline-flex;align-items:center;gap:5px}}
</style></head><body>"""


def _key(mark: str, text: str) -> str:
    return f'<span><svg width="22" height="14">{mark}</svg>{text}</span>'


# every mark the diagrams and plots draw, with what it means
_LEGEND = "<div class=legend>" + "".join([
    _key('<rect x="4" y="2" width="14" height="12" class=bar />',
         "accuracy of a bin (binary: share of y = 1)"),
    _key('<circle cx="11" cy="7" r="3" class=pt />', "the bin's mean confidence"),
    _key('<line x1="0" y1="13" x2="22" y2="1" class=diag />', "perfect calibration"),
    _key('<rect x="4" y="6" width="14" height="8" class=hist />',
         "samples per bin (histogram under each diagram)"),
    _key('<line x1="0" y1="7" x2="22" y2="7" class=real />', "realized accuracy"),
    _key('<line x1="0" y1="7" x2="22" y2="7" class=est />', "estimated accuracy"),
    _key('<line x1="11" y1="0" x2="11" y2="14" class=ev-drift />', "drift alarm"),
    _key('<line x1="11" y1="0" x2="11" y2="14" class=ev-published />',
         "calibrator published"),
]) + "</div>"
# with --every only, so a report without it stays as it was
_PERIOD_CSS = (".band{fill:#e45756;fill-opacity:.15;stroke:none}\n"
               ".ecel{fill:none;stroke:#72b7b2;stroke-width:2} .dot{fill:#4c78a8}\n")
_PERIOD_KEYS = "".join([
    _key('<rect x="0" y="2" width="22" height="10" class=band />',
         "the estimate's band (by period)"),
    _key('<line x1="0" y1="7" x2="22" y2="7" class=ecel />', "ECE (by period)")])
