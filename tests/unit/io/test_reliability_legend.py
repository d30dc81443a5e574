"""/reliability names every mark it draws: a legend of the bars (raw, calibrated,
classwise, too few samples), the Wilson interval, the mean-confidence dot, the
diagonal and the counts, each drawn as the diagrams draw it."""

from __future__ import annotations

import re

from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.io import reliability
from tests.unit.io.test_reliability_classwise import cfg, feed


def test_the_legend_draws_every_fill_and_mark_the_diagrams_use() -> None:
    for classwise in (False, True):
        engine = Engine(cfg(classwise))
        feed(engine, 600, seed=3)
        bins = full_snapshot(engine).rows[0].stats.bins

        def calibrated(_m: str, _s: str, _w: str, b: object = bins) -> object:
            return b  # any bins: a calibrated diagram is drawn

        html = reliability.page(engine.cfg, full_snapshot(engine), calibrated,  # type: ignore[arg-type]
                                {})[2].decode()
        legend = re.search(r"<div class=legend>(.*?)</div>", html, re.S)
        assert legend is not None, html[:2000]
        key, page = legend.group(1), html[legend.end():]
        for fill in set(re.findall(r'class="bar"[^>]*fill="(#[0-9a-f]+)"', page)):
            assert f'fill="{fill}"' in key, (fill, key)  # every bar colour is explained
        assert (reliability.FILLS["classwise"] in key) == classwise
        assert reliability.FILLS["few"] in key and "too few samples" in key
        for mark, words in (('stroke="#333"', "90% Wilson interval"),
                            ('fill="#c44e52"', "mean confidence"),
                            ('stroke-dasharray="4 3"', "perfect calibration"),
                            ("<text", "samples in the bin")):
            assert mark in key and words in key, (mark, words)


def test_a_calibrated_ece_inside_the_raw_interval_is_called_noise() -> None:
    from calmon.io.reliability import within_noise

    assert within_noise(0.106, (0.031, 0.121)).endswith("the difference is noise")
    assert within_noise(0.02, (0.031, 0.121)) == ""  # below it: a real improvement
    assert within_noise(0.05, (None, None)) == ""  # no interval: nothing claimed
