"""The ``replay --every`` part of the HTML report: per model and segment, its ECE,
realized and estimated accuracy (with the estimate's band) over the periods."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from calmon.periods import PeriodRow

PW, PH, PPAD = 520, 150, 40  # a panel's plot area and margin, in px


def periods_section(rows: Sequence[PeriodRow], per_model: int) -> str:
    """One figure per (model, segment): ``__all__`` first, then the segments of most
    samples, at most ``per_model`` per model."""
    if not rows:
        return "<section><h2>By period</h2><p>No period has a prediction.</p></section>"
    every = rows[0].row.window
    series: dict[tuple[str, str], list[PeriodRow]] = {}
    for p in sorted(rows, key=lambda p: (p.row.model, p.row.segment, p.start)):
        series.setdefault((p.row.model, p.row.segment), []).append(p)
    out = [f"<section><h2>By period (every {html.escape(every)})</h2>",
           "<p class=note>Realized accuracy and ECE of each period's predictions with the "
           "labels joined by the end of the replay; the estimated accuracy (dashed) and its "
           "band read the period's pending predictions as of its end.</p>"]
    for model in sorted({m for m, _ in series}):
        mine = [(s, ps) for (m, s), ps in series.items() if m == model]
        mine.sort(key=lambda x: (x[0] != "__all__", -sum(p.row.stats.samples for p in x[1])))
        out.append(f"<h3>{html.escape(model)}</h3><div class=row>")
        out += [_series_figure(f"{model} / {segment}", ps) for segment, ps in mine[:per_model]]
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def _series_figure(title: str, ps: list[PeriodRow]) -> str:
    lo, hi = ps[0].start, ps[-1].end
    span = hi - lo

    def x(p: PeriodRow) -> float:
        return PW * ((p.start + p.end) / 2 - lo) / span

    acc = [p.row.stats.accuracy if p.row.stats.samples else None for p in ps]
    est = [p.row.estimates.estimated_accuracy for p in ps]
    low = [p.row.estimates.estimated_accuracy_lower for p in ps]
    up = [p.row.estimates.estimated_accuracy_upper for p in ps]
    ece = [p.row.stats.ece if p.row.stats.samples else None for p in ps]
    a_lo, a_hi = _range([*acc, *est, *low, *up])
    e_lo, e_hi = _range([*ece, 0.0])

    def y(v: float, vlo: float, vhi: float) -> float:
        return PH * (1 - (v - vlo) / (vhi - vlo))

    band = [(x(p), y(u, a_lo, a_hi), y(lw, a_lo, a_hi))
            for p, u, lw in zip(ps, up, low) if u is not None and lw is not None]
    parts = [f'<figure><svg width="{PW + 2 * PPAD}" height="{2 * PH + 3 * PPAD}" role="img" '
             f'aria-label="{html.escape(title)} by period">',
             f'<g transform="translate({PPAD},{PPAD})">',
             f'<rect width="{PW}" height="{PH}" class=frame />']
    if band:
        pts = " ".join(f"{bx:.1f},{by:.1f}" for bx, by, _ in band)
        pts += " " + " ".join(f"{bx:.1f},{by:.1f}" for bx, _, by in reversed(band))
        parts.append(f'<polygon points="{pts}" class=band />')
    parts += [_line(ps, acc, x, lambda v: y(v, a_lo, a_hi), "real", "realized accuracy"),
              _line(ps, est, x, lambda v: y(v, a_lo, a_hi), "est", "estimated accuracy"),
              f'<text x="0" y="-8">{html.escape(title)}: accuracy</text>',
              f'<text x="-6" y="{PH}" text-anchor="end">{a_lo:.2f}</text>',
              f'<text x="-6" y="10" text-anchor="end">{a_hi:.2f}</text>',
              f'<g transform="translate(0,{PH + PPAD})">',
              f'<rect width="{PW}" height="{PH}" class=frame />',
              _line(ps, ece, x, lambda v: y(v, e_lo, e_hi), "ecel", "ECE"),
              '<text x="0" y="-8">ECE</text>',
              f'<text x="-6" y="{PH}" text-anchor="end">{e_lo:.2f}</text>',
              f'<text x="-6" y="10" text-anchor="end">{e_hi:.2f}</text>',
              f'<text x="0" y="{PH + 16}">{_day(lo)}</text>',
              f'<text x="{PW}" y="{PH + 16}" text-anchor="end">{_day(hi)}</text>',
              f"</g></g></svg><figcaption>{len(ps)} periods</figcaption></figure>"]
    return "".join(parts)


def _line(ps: list[PeriodRow], values: list[float | None], x: Callable[[PeriodRow], float],
          y: Callable[[float], float], cls: str, what: str) -> str:
    """A polyline through the periods that have a value, a dot with its reading on each."""
    pts = [(x(p), y(v), p, v) for p, v in zip(ps, values) if v is not None]
    if not pts:
        return ""
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in pts)
    dots = "".join(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2" class=dot><title>{what} '
                   f'{v:.4f}, period from {_day(p.start)}</title></circle>'
                   for px, py, p, v in pts)
    return f'<polyline points="{line}" class={cls} />{dots}'


def _range(values: Sequence[float | None]) -> tuple[float, float]:
    got = [v for v in values if v is not None and math.isfinite(v)]
    if not got:
        return 0.0, 1.0
    lo, hi = math.floor(min(got) * 20) / 20, math.ceil(max(got) * 20) / 20
    return (lo, hi) if hi > lo else (lo, lo + 0.05)


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")
