"""``/reliability``: reliability diagrams as plain HTML + inline SVG, no JavaScript.

One diagram per model and segment for the chosen window: a bar per non-empty
bin at its accuracy (observed frequency) with its Wilson interval at
``metrics.interval_level``, a dot at its mean confidence, the diagonal of
perfect calibration, and the sample count above each bar. The ECE comes with
its interval, the realized accuracy with the estimate for the predictions still
waiting for labels. A series with fewer than ``recalibration.min_samples``
samples is drawn in grey as "too few samples": its gaps are mostly noise.
The calibrated diagram (after the live calibrator) sits beside the raw one.
With ``metrics.classwise``, a multiclass series also names its worst-calibrated class
(largest one-vs-rest ECE, p_k against [y = k]) and shows that class's diagram.
Query: ``?window=24h&model=ctr&segment=__all__&page=2`` (all optional; other
parameters are ignored, an unknown window or page falls back to the default). A
model picker heads the page; the series are listed worst first (by the lower end
of the ECE interval, then the ECE; too-few-samples series last), ``PAGE_SIZE`` a
page. Rendered from the latest snapshot: a request computes no statistic.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Hashable
from statistics import NormalDist
from urllib.parse import urlencode

from calmon.config import Config
from calmon.engine.estimates import Estimates
from calmon.engine.metrics import Bins, ece, within_interval
from calmon.engine.rows import Row, Snapshot

W, H, PAD = 360, 260, 34  # svg size and plot padding
PAGE_SIZE = 24  # series per page
CalibratedBins = Callable[[str, str, str], Bins | None]
# a diagram's bars by kind (and greyed when its series has too few samples)
FILLS = {"raw": "#4878d0", "calibrated": "#6acc64", "classwise": "#d65f5f", "few": "#b0b0b0"}


def wilson(successes: float, n: float, level: float) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion at ``level``."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def diagram(bins: Bins, title: str, kind: str, level: float = 0.9, few: str = "") -> str:
    """One SVG: a ``<rect class="bar">`` per non-empty bin, a ``<line class="band">``
    for its Wilson interval; greyed with a note when ``few`` says why."""
    n_bins = len(bins.count)
    pw, ph = W - 2 * PAD, H - 2 * PAD
    bw = pw / n_bins

    def x(v: float) -> float:
        return PAD + v * pw

    def y(v: float) -> float:
        return PAD + (1 - v) * ph

    parts = [f'<svg class="diagram {kind}" xmlns="http://www.w3.org/2000/svg" width="{W}" '
             f'height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{html.escape(title)}">',
             f'<rect x="{PAD}" y="{PAD}" width="{pw}" height="{ph}" fill="#fafafa" '
             'stroke="#999"/>',
             f'<line class="diagonal" x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" '
             'stroke="#888" stroke-dasharray="4 3"/>']
    for t in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{x(t)}" y="{H - PAD + 14}" font-size="10" '
                     f'text-anchor="middle">{t:g}</text>')
        parts.append(f'<text x="{PAD - 6}" y="{y(t) + 3}" font-size="10" '
                     f'text-anchor="end">{t:g}</text>')
    fill = FILLS["few"] if few else FILLS.get(kind, FILLS["calibrated"])
    for b in range(n_bins):
        n = float(bins.count[b])
        if n <= 0:
            continue
        acc = float(bins.correct[b]) / n
        conf = float(bins.conf[b]) / n
        top = y(acc)
        parts.append(
            f'<rect class="bar" data-bin="{b}" data-count="{n:.0f}" x="{x(b / n_bins) + 1:.2f}" '
            f'y="{top:.2f}" width="{bw - 2:.2f}" height="{PAD + ph - top:.2f}" fill="{fill}" '
            f'fill-opacity="0.75"><title>bin {b}: n={n:.0f}, accuracy {acc:.3f}, '
            f'confidence {conf:.3f}</title></rect>')
        lo, hi = wilson(float(bins.correct[b]), n, level)
        mid = x((b + 0.5) / n_bins)
        parts.append(f'<line class="band" data-bin="{b}" data-lo="{lo:.6f}" data-hi="{hi:.6f}" '
                     f'x1="{mid:.2f}" x2="{mid:.2f}" y1="{y(lo):.2f}" y2="{y(hi):.2f}" '
                     'stroke="#333" stroke-width="1.2"/>')
        parts.append(f'<circle class="conf" cx="{x(conf):.2f}" cy="{y(conf):.2f}" r="2.5" '
                     'fill="#c44e52"/>')
        parts.append(f'<text class="count" x="{x((b + 0.5) / n_bins):.2f}" y="{PAD - 4}" '
                     f'font-size="8" text-anchor="middle">{_short(n)}</text>')
    if few:
        parts.append(f'<rect x="{x(0.12):.2f}" y="{y(0.55) - 17:.2f}" width="{0.76 * pw:.2f}" '
                     'height="38" fill="#fff" fill-opacity="0.85" rx="4"/>')
        parts.append(f'<text class="few" x="{x(0.5)}" y="{y(0.55)}" font-size="15" '
                     f'text-anchor="middle" fill="#555">too few samples</text>'
                     f'<text x="{x(0.5)}" y="{y(0.55) + 16}" font-size="10" '
                     f'text-anchor="middle" fill="#555">{html.escape(few)}</text>')
    parts.append(f'<text x="{W / 2}" y="{H - 4}" font-size="11" text-anchor="middle">'
                 'confidence</text>')
    parts.append(f'<text x="{W / 2}" y="14" font-size="12" text-anchor="middle" '
                 f'font-weight="bold">{html.escape(title)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _short(n: float) -> str:
    """A sample count in at most 4 characters, so neighbouring bins' counts never overlap."""
    if n < 1000:
        return f"{n:.0f}"
    if n < 9950:
        return f"{n / 1000:.1f}k"
    if n < 999_500:
        return f"{n / 1000:.0f}k"
    return f"{n / 1e6:.1f}M"


def _ece_text(bins: Bins, interval: tuple[float | None, float | None] | None = None,
              level: float = 0.9) -> str:
    if bins.count.sum() == 0:
        return "no samples"
    text = f"ECE {ece(bins.count, bins.conf, bins.correct):.4f}"
    if interval is not None and interval[0] is not None and interval[1] is not None:
        text += f" [{interval[0]:.4f}, {interval[1]:.4f}] at {level:.0%}"
    return text + f", n={bins.count.sum():.0f}"


def within_noise(calibrated: float, interval: tuple[float | None, float | None]) -> str:
    """Said beside a calibrated ECE inside the raw ECE's interval: the two differ by less
    than the samples can tell, whichever is larger (a calibrated ECE above the raw one
    there is not the fix making it worse)."""
    if not within_interval(calibrated, interval):
        return ""
    return "; within the raw ECE's interval: the difference is noise"


def _accuracy_text(row: Row) -> str:
    """Realized accuracy of the joined samples beside the estimate for the pending ones."""
    est = row.estimates
    realized = (f"realized accuracy {row.stats.accuracy:.3f}" if row.stats.accuracy is not None
                else "no realized accuracy yet")
    if est.pending_samples and est.estimated_accuracy is not None:
        band = ""
        if est.estimated_accuracy_lower is not None and est.estimated_accuracy_upper is not None:
            band = (f" [{est.estimated_accuracy_lower:.3f}, "
                    f"{est.estimated_accuracy_upper:.3f}]")
        estimated = (f"estimated {est.estimated_accuracy:.3f}{band} for "
                     f"{est.pending_samples} predictions awaiting labels, "
                     f"{_basis_text(est)}")
    else:
        estimated = f"no predictions awaiting labels ({_basis_text(est)})"
    return f"{realized} &middot; {estimated}"


BASES = {"series": "its estimation map", "model": "its model's estimation map",
         "last": "its last estimation map (no recent labels)",
         "live": "the live calibrator", "raw": "the raw scores"}


def _basis_text(est: Estimates) -> str:
    """What an estimate is read through (contract v5 ``estimate_basis``)."""
    what = BASES.get(est.estimate_basis, est.estimate_basis)
    if est.estimate_fit_samples:
        what += f" of {est.estimate_fit_samples:,} labelled samples"
    return f"read through {what}"


class Page:
    """The /reliability handler (see the module docstring); ``cache_key`` is the parsed
    query as far as it changes the page, so junk parameters share one cached answer."""

    def __init__(self, cfg: Config, snapshot: Callable[[], Snapshot],
                 calibrated: CalibratedBins | None = None, *,
                 calibrated_note: str = "buffered samples") -> None:
        """``calibrated_note``: what the calibrated diagrams are drawn from (scaled out,
        the owner's samples of every instance, not this instance's raw share)."""
        self.cfg = cfg
        self.snapshot = snapshot
        self.calibrated = calibrated
        self.calibrated_note = calibrated_note
        self.windows = [w.name for w in cfg.metrics.windows]

    def cache_key(self, query: dict[str, list[str]]) -> Hashable:
        """The query as the page reads it: junk parameters, an unknown window, model or
        segment and a page past the last all map to the page that is shown for them,
        so junk query strings share a few cache entries."""
        window = query.get("window", [None])[0]
        shown = window if window in self.windows else self.windows[-1]
        model = query.get("model", [None])[0]
        segment = query.get("segment", [None])[0]
        rows = [r for r in self.snapshot().rows if r.window == shown and r.stats.samples > 0]
        if model is not None and all(r.model != model for r in rows):
            model = "\0unknown"
        if segment is not None and all(r.segment != segment for r in rows):
            segment = "\0unknown"
        matching = sum(1 for r in rows if model in (None, r.model)
                       and segment in (None, r.segment))
        pages = max(1, math.ceil(matching / PAGE_SIZE))
        return (shown, window is not None and window != shown, model, segment,
                min(_page_number(query), pages))

    def __call__(self, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        return page(self.cfg, self.snapshot(), self.calibrated, query,
                    calibrated_note=self.calibrated_note)


def _page_number(query: dict[str, list[str]]) -> int:
    raw = query.get("page", ["1"])[0]
    return int(raw) if raw.isdigit() and 0 < len(raw) < 7 and int(raw) > 0 else 1


def _worst_first(row: Row, min_samples: int) -> tuple[bool, float, float, str, str]:
    st = row.stats
    return (st.samples < min_samples, -(st.ece_lower or 0.0), -(st.ece or 0.0), row.model,
            row.segment)


def page(cfg: Config, view: Snapshot, calibrated: CalibratedBins | None,
         query: dict[str, list[str]], *, calibrated_note: str = "buffered samples"
         ) -> tuple[int, str, bytes]:
    windows = [w.name for w in cfg.metrics.windows]
    asked = query.get("window", [None])[0]
    window = asked if asked in windows else windows[-1]
    want_model = query.get("model", [None])[0]
    want_segment = query.get("segment", [None])[0]
    number = _page_number(query)
    level = cfg.metrics.interval_level
    min_samples = cfg.recalibration.min_samples

    def link(**over: object) -> str:
        params = {"window": window, "model": want_model, "segment": want_segment, **over}
        return "?" + html.escape(urlencode({k: v for k, v in params.items() if v is not None}))

    links = " ".join(
        f'<a href="{link(window=w, page=None)}"{" class=sel" if w == window else ""}>'
        f"{html.escape(w)}</a>" for w in windows)
    models = sorted({r.model for r in view.rows})
    picker = " ".join(
        f'<a class="model{" sel" if m == want_model else ""}" '
        f'href="{link(model=m, segment=None, page=None)}">{html.escape(m)}</a>' for m in models)
    picker = (f'<a href="{link(model=None, segment=None, page=None)}"'
              f'{" class=sel" if want_model is None else ""}>all</a> ' + picker)
    note = (f" (unknown window: showing {html.escape(window)})"
            if asked is not None and asked != window else "")
    rows = [r for r in view.rows if r.window == window and r.stats.samples > 0
            and want_model in (None, r.model) and want_segment in (None, r.segment)]
    rows.sort(key=lambda r: _worst_first(r, min_samples))
    pages = max(1, math.ceil(len(rows) / PAGE_SIZE))
    number = min(number, pages)
    shown_rows = rows[(number - 1) * PAGE_SIZE:number * PAGE_SIZE]
    body = [f"<h1>calmon reliability</h1><p>window: {links}{note} &middot; binary: P(y=1) "
            "vs y; multiclass: top-label confidence vs correct; ECE with its interval for "
            "the population ECE. Estimated accuracy, with its band, assumes P(y | score) as "
            "the labels showed it still holds (exact under covariate shift, wrong under "
            "concept shift)</p>"
            + legend(level, cfg.metrics.classwise) +
            f"<nav class=models>models: {picker}</nav>"
            f"<p class=pages>{len(rows)} series, worst first (lower end of the ECE interval)"
            f"{_pager(link, number, pages)}</p><div class=grid>"]
    body.extend(_section(row, calibrated, window, level, min_samples, calibrated_note)
                for row in shown_rows)
    body.append("</div>")
    if not shown_rows:
        body.append("<p>No joined samples in this window yet.</p>")
    doc = _HEAD + "".join(body) + "</body></html>"
    return 200, "text/html; charset=utf-8", doc.encode()


def _key(mark: str, text: str) -> str:
    return (f'<span class=key><svg width="22" height="16" viewBox="0 0 22 16">{mark}</svg>'
            f"{text}</span>")


def legend(level: float, classwise: bool) -> str:
    """Every mark of the diagrams, drawn as they draw it, with what it means."""
    def bar(kind: str) -> str:
        return (f'<rect class="key" x="5" y="3" width="12" height="13" fill="{FILLS[kind]}" '
                'fill-opacity="0.75"/>')

    keys = [_key(bar("raw"), "raw scores: observed frequency in the bin (binary: share of "
                             "y = 1; multiclass: share correct)"),
            _key(bar("calibrated"), "the same after the live calibrator"),
            *([_key(bar("classwise"), "the worst class, p_k vs [y = k]")] if classwise else []),
            _key(bar("few"), "too few samples to judge"),
            _key('<line x1="11" y1="1" x2="11" y2="15" stroke="#333" stroke-width="1.2"/>',
                 f"its {level:.0%} Wilson interval"),
            _key('<circle cx="11" cy="8" r="3" fill="#c44e52"/>',
                 "the bin's mean confidence (on the diagonal: calibrated)"),
            _key('<line x1="1" y1="15" x2="21" y2="1" stroke="#888" stroke-dasharray="4 3"/>',
                 "perfect calibration"),
            _key('<text x="11" y="12" font-size="9" text-anchor="middle">12</text>',
                 "samples in the bin")]
    return f"<div class=legend>{''.join(keys)}</div>"


def _section(row: Row, calibrated: CalibratedBins | None, window: str, level: float,
             min_samples: int, calibrated_note: str) -> str:
    """One series: its raw diagram, the calibrated one, the worst class's."""
    name = f"{row.model} / {row.segment}"
    raw = row.stats.bins
    few = (f"n={row.stats.samples} < recalibration.min_samples {min_samples}"
           if row.stats.samples < min_samples else "")
    interval = (row.stats.ece_lower, row.stats.ece_upper)
    cells = [f'<figure>{diagram(raw, "raw", "raw", level, few)}<figcaption>'
             f"{_ece_text(raw, interval, level)}</figcaption></figure>"]
    cal = calibrated(row.model, row.segment, window) if calibrated else None
    if cal is not None and cal.count.sum() > 0:
        cells.append(f'<figure>{diagram(cal, "calibrated", "calibrated", level)}'
                     f"<figcaption>{_ece_text(cal)} ({html.escape(calibrated_note)})"
                     f"{within_noise(ece(cal.count, cal.conf, cal.correct), interval)}"
                     "</figcaption></figure>")
    worst = row.worst_class
    if worst is not None:  # metrics.classwise: the class that is off most, one-vs-rest
        cells.append(
            f'<figure class=worst data-class="{worst.cls}">'
            f'{diagram(worst.bins, f"class {worst.cls} vs rest", "classwise", level)}'
            f"<figcaption>worst-calibrated class {worst.cls} of classwise ECE "
            f"{row.classwise_ece or 0.0:.4f}: p_{worst.cls} vs [y = {worst.cls}], "
            f"{_ece_text(worst.bins)}</figcaption></figure>")
    target = "P(y=1) vs y" if row.binary else "top-label confidence vs correct"
    return (f'<section class="series{" few" if few else ""}" '
            f'data-model="{html.escape(row.model)}" '
            f'data-segment="{html.escape(row.segment)}"><h2>{html.escape(name)} '
            f"<small>{target}</small></h2>"
            f"<p class=accuracy>{_accuracy_text(row)}</p>"
            f"<div class=row>{''.join(cells)}</div></section>")


_HEAD = ("<!doctype html><html><head><meta charset=utf-8><title>calmon reliability</title>"
          "<style>body{font-family:sans-serif;margin:1.5em;color:#222}"
          ".row{display:flex;gap:1em;flex-wrap:wrap}figure{margin:0}"
          "figcaption{font-size:12px;text-align:center}a.sel{font-weight:bold}"
          "h1{margin:0 0 .3em;font-size:24px}p{margin:.3em 0 1em;font-size:14px}"
          "nav.models{font-size:13px;margin:0 0 .6em}nav.models a{margin-right:.5em}"
          ".dot{color:#c44e52}.legend{display:flex;flex-wrap:wrap;gap:.2em 1.2em;"
          "font-size:12px;color:#444;margin:0 0 .8em}"
          ".key{display:inline-flex;align-items:center;gap:.3em}"
          ".grid{display:flex;flex-wrap:wrap;gap:.8em 1.5em;align-items:flex-start}"
          "section{border-top:1px solid #ddd;padding-top:.3em}"
          "p.accuracy{font-size:12px;margin:0 0 .3em;color:#444}"
          "h2{font-size:16px;margin:.2em 0}h2 small{font-weight:normal;color:#666;"
          "font-size:12px;margin-left:.5em}</style></head><body>")


def _pager(link: Callable[..., str], number: int, pages: int) -> str:
    if pages <= 1:
        return ""
    parts = [f" &middot; page {number} of {pages}"]
    if number > 1:
        parts.append(f' <a class=prev href="{link(page=number - 1)}">previous</a>')
    if number < pages:
        parts.append(f' <a class=next href="{link(page=number + 1)}">next</a>')
    return "".join(parts)
