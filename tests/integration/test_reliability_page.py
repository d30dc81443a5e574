"""``/reliability`` of a real ``calmon run`` daemon: the SVG reliability diagrams
match the produced records, and headless Chromium renders the page.

The expected bins come from the produced records (right-closed equal-width bins,
``np.searchsorted(edges, conf, side="left")``), never from calmon's engine.
"""

from __future__ import annotations

import math
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import create_topics, unique_topic
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    confidence_and_correct,
    end_positions,
    expected_bins,
    http_get,
    interleave,
    make_dataset,
    segment_labels,
    wait_until,
    write_config,
)

pytestmark = [
    pytest.mark.integration,
    # one broker: what is tested here is Prometheus / the pages / HTTP TLS, the broker is
    # incidental (and this module is among the suite's heaviest); the Kafka side runs
    # on both brokers in the daemon tests
    pytest.mark.brokers("tansu"),
]

BINS = 15
SLICES = (("country",), ("device",))
N_PREDICTIONS = 1500
WINDOW = "7d"  # make_dataset spreads prediction ts over 2 h: every sample is in the window
MIN_SAMPLES = 400  # recalibration.min_samples: smaller series are drawn as "too few samples"
LEVEL = 0.9  # metrics.interval_level (the default)


# ---------------------------------------------------------------- parsing the page


@dataclass
class Svg:
    kind: str  # "raw" or "calibrated"
    plot: dict[str, float] = field(default_factory=dict)  # x, y, width, height of the plot area
    bars: list[dict[str, str]] = field(default_factory=list)
    dots: list[dict[str, str]] = field(default_factory=list)
    bands: list[dict[str, str]] = field(default_factory=list)
    few: bool = False  # the "too few samples" note is drawn


@dataclass
class Section:
    model: str
    segment: str
    svgs: list[Svg] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    accuracy: str = ""


class PageParser(HTMLParser):
    """Collects every ``<section class="series">`` with its SVGs' plot area, bars and dots."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[Section] = []
        self._svg: Svg | None = None
        self._caption: list[str] | None = None
        self._accuracy: list[str] | None = None
        self._legend = False  # inside the legend: its marks are keys, not a diagram

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "div" and "legend" in classes:
            self._legend = True
        if self._legend:
            return
        if tag == "section" and "series" in classes:
            self.sections.append(Section(a["data-model"], a["data-segment"], classes=classes))
        elif tag == "p" and "accuracy" in classes and self.sections:
            self._accuracy = []
        elif tag == "line" and self._svg is not None and "band" in classes:
            self._svg.bands.append(a)
        elif tag == "text" and self._svg is not None and "few" in classes:
            self._svg.few = True
        elif tag == "svg":
            assert self.sections, "an svg outside any section"
            self._svg = Svg(classes[-1])
            self.sections[-1].svgs.append(self._svg)
        elif tag == "rect" and self._svg is not None:
            if "bar" in classes:
                self._svg.bars.append(a)
            elif not self._svg.plot:  # the first plain rect is the plot area
                self._svg.plot = {k: float(a[k]) for k in ("x", "y", "width", "height")}
        elif tag == "circle" and self._svg is not None and "conf" in classes:
            self._svg.dots.append(a)
        elif tag == "figcaption":
            self._caption = []

    def handle_endtag(self, tag: str) -> None:
        if self._legend:
            self._legend = tag != "div"  # the legend holds no div of its own
            return
        if tag == "svg":
            self._svg = None
        elif tag == "figcaption" and self._caption is not None:
            self.sections[-1].captions.append("".join(self._caption))
            self._caption = None
        elif tag == "p" and self._accuracy is not None:
            self.sections[-1].accuracy = "".join(self._accuracy)
            self._accuracy = None

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption.append(data)
        if self._accuracy is not None:
            self._accuracy.append(data)


def parse_page(body: bytes) -> dict[tuple[str, str], Section]:
    parser = PageParser()
    parser.feed(body.decode("utf-8"))
    parser.close()
    out = {}
    for s in parser.sections:
        assert (s.model, s.segment) not in out, f"two sections for {s.model}/{s.segment}"
        out[(s.model, s.segment)] = s
    return out


# ---------------------------------------------------------------- independent numbers


def confidence_sums(preds: list[dict[str, Any]], labels: list[dict[str, Any]]
                    ) -> Counter[tuple[str, str, str]]:
    """Sum of confidences per (model, segment, bin), same binning as ``expected_bins``."""
    by_id = {str(lab["id"]): int(lab["label"]) for lab in labels}
    edges = np.linspace(0.0, 1.0, BINS + 1)[1:-1]
    out: Counter[tuple[str, str, str]] = Counter()
    for p in preds:
        conf, _ = confidence_and_correct(p, by_id[str(p["id"])])
        b = str(int(np.searchsorted(edges, conf, side="left")))
        for seg in segment_labels(p, SLICES):
            out[(p["model"], seg, b)] += conf
    return out


def wilson_numpy(k: float, n: float, level: float) -> tuple[float, float]:
    """The Wilson score interval, from its textbook formula (z from scipy)."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    denom = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return max(0.0, centre - half), min(1.0, centre + half)


# ---------------------------------------------------------------- a tiny PNG reader


def read_png(path: Path) -> tuple[int, int, np.ndarray | None]:
    """(width, height, pixels as an (h, w, channels) uint8 array). Pixels are None for
    anything but 8-bit, non-interlaced RGB/RGBA (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        pos += 12 + n
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert header is not None, "no IHDR"
    w, h, depth, color, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace:
        return w, h, None
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = w * channels
    assert raw.size == h * (stride + 1), "truncated image data"
    rows = raw.reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for i in range(h):
        f, line = int(rows[i, 0]), rows[i, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: running sum per channel, mod 256
            cur = np.cumsum(line.reshape(w, channels), axis=0, dtype=np.uint8).ravel()
        elif f == 2:  # Up
            cur = line + prev
        else:  # Average (3) or Paeth (4): sequential along the row
            cur_l = [0] * stride
            ln, up = line.tolist(), prev.tolist()
            for j in range(stride):
                a = cur_l[j - channels] if j >= channels else 0
                b = up[j]
                if f == 3:
                    pred = (a + b) >> 1
                else:
                    c = up[j - channels] if j >= channels else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur_l[j] = (ln[j] + pred) & 0xFF
            cur = np.array(cur_l, dtype=np.uint8)
        out[i] = cur
        prev = cur
    return w, h, out.reshape(h, w, channels)


def _hex(colour: str) -> np.ndarray:
    m = re.fullmatch(r"#([0-9a-fA-F]{2})([0-9a-fA-F]{2})([0-9a-fA-F]{2})", colour)
    assert m, colour
    return np.array([int(g, 16) for g in m.groups()], dtype=float)


# ---------------------------------------------------------------- the daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
           ) -> Iterator[tuple[CalmonDaemon, list[dict[str, Any]], list[dict[str, Any]]]]:
    """A daemon that has consumed ``N_PREDICTIONS`` predictions and all their labels."""
    tmp = tmp_path_factory.mktemp("reliability")
    pred_topic, label_topic = unique_topic("rel-pred"), unique_topic("rel-label")
    create_topics(kafka_bootstrap, [pred_topic, label_topic], partitions=2)
    cfg = write_config(tmp / "calmon.yaml", kafka_bootstrap, pred_topic, label_topic,
                       metrics={"bins": BINS, "windows": ["1h", "24h", WINDOW]},
                       segments={"slices": [list(s) for s in SLICES], "max_values": 50},
                       recalibration={"enabled": False, "min_samples": MIN_SAMPLES})
    preds, labels = make_dataset(N_PREDICTIONS, seed=11)
    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        md = producer.send(interleave(preds, labels, pred_topic, label_topic, seed=12))
        daemon.wait_positions(end_positions(md), timeout=60)
        assert daemon.counters()["joined"] == N_PREDICTIONS
        wait_until(lambda: (st := daemon.status()["statistics"])["current"]
                   and st["age_seconds"] == 0, 60, "statistics of the last batch, refreshed")
        yield daemon, preds, labels


def all_pages(port: int, query: str) -> dict[tuple[str, str], Section]:
    """The sections of every page of /reliability?query, following its next links."""
    out: dict[tuple[str, str], Section] = {}
    number = 1
    while True:
        code, body = http_get(port, f"/reliability?{query}&page={number}")
        assert code == 200, body[:300]
        page = parse_page(body)
        assert not set(page) & set(out), "a series on two pages"
        out.update(page)
        if b"class=next" not in body:
            return out
        number += 1


def test_diagrams_have_one_bar_per_non_empty_bin_at_its_accuracy(served: Any) -> None:
    daemon, preds, labels = served
    sections = all_pages(daemon.port, f"window={WINDOW}")
    counts, correct = expected_bins(preds, labels, BINS, SLICES)
    conf_sums = confidence_sums(preds, labels)
    expected_series = {(m, s) for (m, s, _b), n in counts.items() if n > 0}
    assert set(sections) == expected_series
    bars_checked = 0
    for (model, segment), section in sections.items():
        assert [svg.kind for svg in section.svgs] == ["raw"], "recalibration is off: raw only"
        raw = section.svgs[0]
        want = {int(b): n for (m, s, b), n in counts.items()
                if (m, s) == (model, segment) and n > 0}
        got_bins = [int(bar["data-bin"]) for bar in raw.bars]
        assert len(got_bins) == len(set(got_bins)), f"{model}/{segment}: a bin drawn twice"
        assert set(got_bins) == set(want), (model, segment, sorted(got_bins), sorted(want))
        assert len(raw.dots) == len(raw.bars)
        px, py, pw, ph = (raw.plot[k] for k in ("x", "y", "width", "height"))
        bottom = py + ph
        for bar, dot in zip(raw.bars, raw.dots, strict=True):
            b = int(bar["data-bin"])
            n = want[b]
            acc = correct[(model, segment, str(b))] / n
            conf = conf_sums[(model, segment, str(b))] / n
            assert int(bar["data-count"]) == n, (model, segment, b)
            height, top = float(bar["height"]), float(bar["y"])
            assert math.isclose(height, acc * ph, abs_tol=0.011), (model, segment, b, acc)
            assert math.isclose(top + height, bottom, abs_tol=0.011), (model, segment, b)
            left = float(bar["x"])
            assert px + b / BINS * pw <= left < px + (b + 1) / BINS * pw, (model, segment, b)
            assert math.isclose(float(dot["cx"]), px + conf * pw, abs_tol=0.011)
            assert math.isclose(float(dot["cy"]), py + (1 - conf) * ph, abs_tol=0.011)
            bars_checked += 1
        # the caption's ECE, from the same independent sums
        total = sum(want.values())
        ece = sum(abs(conf_sums[(model, segment, str(b))] - correct[(model, segment, str(b))])
                  for b in want) / total
        m = re.fullmatch(r"ECE (\d\.\d{4}) \[(\d\.\d{4}), (\d\.\d{4})\] at 90%, n=(\d+)",
                         section.captions[0])
        assert m, section.captions
        assert int(m.group(4)) == total
        assert abs(float(m.group(1)) - ece) <= 5e-5 + 1e-12, (model, segment, m.group(1), ece)
        assert float(m.group(2)) <= float(m.group(3))
        # Wilson bands per bin, computed here from the independent counts
        assert [int(b["data-bin"]) for b in raw.bands] == got_bins
        for band in raw.bands:
            b = int(band["data-bin"])
            lo, hi = wilson_numpy(correct[(model, segment, str(b))], want[b], LEVEL)
            assert abs(float(band["data-lo"]) - lo) < 1e-6, (model, segment, b)
            assert abs(float(band["data-hi"]) - hi) < 1e-6, (model, segment, b)
            assert lo - 1e-12 <= correct[(model, segment, str(b))] / want[b] <= hi + 1e-12
        # too few samples: grey with a note, not drawn as miscalibrated
        few = total < MIN_SAMPLES
        assert ("few" in section.classes) == few == raw.few, (model, segment, total)
        # every label arrived: realized accuracy, and nothing awaiting labels
        assert "realized accuracy" in section.accuracy
        assert "no predictions awaiting labels" in section.accuracy
    # multiclass top-label confidence is >= 1/4 with 4 classes: its low bins stay empty
    assert not any(int(bar["data-bin"]) < 3
                   for bar in sections[("intent4", "__all__")].svgs[0].bars)
    assert bars_checked > 100
    assert any("few" in s.classes for s in sections.values())
    assert any("few" not in s.classes for s in sections.values())


def test_filters_and_unknown_window(served: Any) -> None:
    daemon, _, _ = served
    code, body = http_get(daemon.port, f"/reliability?window={WINDOW}&model=intent4"
                          "&segment=__all__")
    assert code == 200
    assert list(parse_page(body)) == [("intent4", "__all__")]
    # an unknown window (or any junk) is answered with the default window
    code, body = http_get(daemon.port, "/reliability?window=5w&junk=1")
    assert code == 200 and b"unknown window: showing" in body


def test_headless_chromium_renders_the_page(served: Any, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium)")
    daemon, _, _ = served
    url = f"http://127.0.0.1:{daemon.port}/reliability?window={WINDOW}"
    png = tmp_path / "reliability.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
         "--window-size=1200,900", url],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert png.is_file(), proc.stderr[-2000:]
    assert png.stat().st_size > 10_000, png.stat().st_size
    w, h, pixels = read_png(png)
    assert (w, h) == (1200, 900)
    assert pixels is not None, "unexpected PNG format from Chromium"
    rgb = pixels[:, :, :3].reshape(-1, 3)
    colours = np.unique(rgb, axis=0)
    assert len(colours) >= 16, f"only {len(colours)} colours: a blank page?"
    background = np.all(rgb >= 245, axis=1).mean()
    assert background < 0.97, f"{background:.1%} of the screenshot is blank"
    # The bars are drawn: pixels in the bar colour, as the SVG asks for it
    # (fill at fill-opacity over the plot area's fill).
    _, body = http_get(daemon.port, f"/reliability?window={WINDOW}")
    text = body.decode()
    bar = re.search(r'<rect class="bar"[^>]* fill="(#\w{6})" fill-opacity="([\d.]+)"', text)
    plot = re.search(r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" '
                     r'fill="(#\w{6})"', text)
    assert bar and plot
    alpha = float(bar.group(2))
    want = alpha * _hex(bar.group(1)) + (1 - alpha) * _hex(plot.group(1))
    near = np.all(np.abs(rgb.astype(float) - want) <= 3, axis=1).sum()
    assert near >= 2000, f"only {near} pixels in the bar colour {want.round()}"
