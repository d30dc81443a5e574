"""What a scrape returns and costs (calmon.io.exporter, calmon.io.exposition, the
/reliability page): rendered from a snapshot without computing a statistic, shared by
concurrent requests, gzip when asked, and as metrics.export says."""

from __future__ import annotations

import gzip
import threading
from typing import Any

import numpy as np
import pytest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from calmon.config import from_dict
from calmon.engine import metrics, snapshot, stats
from calmon.engine.engine import Engine
from calmon.engine.snapshot import Refresher
from calmon.errors import ConfigError
from calmon.io import reliability
from calmon.io.exporter import FAMILIES, CalmonCollector, WindowCollector
from calmon.io.exposition import Exposition, new_registry
from calmon.io.http import HttpServer
from tests.daemon_helpers import http_get
from tests.oracle import T0, L, P

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def fed_engine(cfg_over: dict[str, Any] | None = None) -> Engine:
    engine = Engine(from_dict({"segments": {"slices": [["country"]]}, **(cfg_over or {})}))
    rng = np.random.default_rng(7)
    raws = []
    for i in range(600):
        p = float(rng.random())
        model = f"m{i % 2}"
        raws += [P(f"{i}", T0 + i, model=model, prob=p, segment={"country": f"c{i % 3}"}),
                 L(f"{i}", int(rng.random() < p))]
    raws += [P(f"w{i}", T0 + 600 + i, model="m0", prob=0.5) for i in range(5)]  # pending
    assert engine.feed(raws) == []
    return engine


def families(text: str) -> dict[str, set[tuple[str, str, str]]]:
    """Family name -> the (model, segment, window) of its samples."""
    out: dict[str, set[tuple[str, str, str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).add(
                (s.labels.get("model", ""), s.labels.get("segment", ""),
                 s.labels.get("window", s.labels.get("bin", ""))))
    return out


def scrape_text(engine: Engine, snap: Any) -> str:
    windows = WindowCollector(lambda: snap, engine.cfg)
    rest = CalmonCollector(engine, snapshot=lambda: snap, windows=False,
                           statistics_age=lambda: snap.age(snap.built_at))
    expo = Exposition(windows, lambda: snap.serial, [rest])
    ctype, enc, parts = expo.render("", "")
    assert enc is None and ctype.startswith("text/plain")
    return b"".join(parts).decode()


class Tripwire:
    """Fails any call of a statistic: a scrape must only render."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for mod, names in ((metrics, ("from_vector", "plugin_stats", "ece_interval", "smece",
                                      "ece", "ace", "noise_floor", "ece_l2_debiased")),
                           (stats, ("ece_interval_batch", "smece_batch",
                                    "ece_l2_debiased_batch")),
                           (snapshot, ("expensive_stats", "plugin_stats"))):
            for name in names:
                monkeypatch.setattr(mod, name, self._trip)

    def _trip(self, *_a: object, **_k: object) -> None:
        self.calls += 1
        raise AssertionError("a scrape computed a statistic")


def test_a_scrape_never_computes_the_statistics(monkeypatch) -> None:
    engine = fed_engine()
    snap = Refresher(engine).update(full=True)
    trip = Tripwire(monkeypatch)
    monkeypatch.setattr(Refresher, "update", lambda self, **_k: trip._trip())
    text = scrape_text(engine, snap)
    for q in ({}, {"model": ["m0"]}, {"segment": ["country=c1"], "window": ["1h"]}):
        code, _, body = reliability.page(engine.cfg, snap, None, q)
        assert code == 200 and body
    assert trip.calls == 0
    assert "calmon_ece_upper{" in text and "calmon_smece{" in text


def test_the_export_options_change_exactly_the_families_they_name() -> None:
    base = fed_engine()
    default = families(scrape_text(base, Refresher(base).update(full=True)))
    everything_cfg = {"metrics": {"export": {"bins": "all", "segment_families": None}}}
    full_engine = fed_engine(everything_cfg)
    full = families(scrape_text(full_engine, Refresher(full_engine).update(full=True)))
    segs = {"country=c0", "country=c1", "country=c2"}
    window_fams = {k for k, v in full.items() if any(w in ("1h", "24h", "7d") for _, _, w in v)}
    seg_default = {"calmon_ece", "calmon_ece_lower", "calmon_ece_upper",
                   "calmon_window_samples", "calmon_observed_over_expected"}
    for name in window_fams:
        all_rows = {k for k in full[name] if k[1] == "__all__"}
        assert {k for k in default.get(name, set()) if k[1] == "__all__"} == all_rows, name
        seg_rows = {k for k in default.get(name, set()) if k[1] in segs}
        want = {k for k in full[name] if k[1] in segs} if name in seg_default else set()
        assert seg_rows == want, name
    assert seg_default <= window_fams  # the default list exists and was compared
    # bins: models keeps each model's __all__ only (nothing counted in totals here, so
    # compare the policy itself), none drops them
    # windows and families: only the named ones move
    cfg = {"metrics": {"export": {"windows": ["1h"], "families": ["ece", "window_samples"],
                                  "segment_families": ["window_samples"]}}}
    eng = fed_engine(cfg)
    got = families(scrape_text(eng, Refresher(eng).update(full=True)))
    window_got = {k for k, v in got.items() if any(w in ("1h", "24h", "7d") for _, _, w in v)}
    assert window_got == {"calmon_ece", "calmon_window_samples"}
    assert {w for _, _, w in got["calmon_window_samples"]} == {"1h"}
    assert {s for _, s, _ in got["calmon_ece"]} == {"__all__"}
    assert {s for _, s, _ in got["calmon_window_samples"]} == {"__all__"} | segs
    # what is never filtered is still there
    for name in ("calmon_duplicates_total", "calmon_invalid_records_total",
                 "calmon_join_pending", "calmon_statistics_age_seconds"):
        assert name in got, name


def test_bins_export_option_keeps_models_all_or_none() -> None:
    from calmon.io.exporter import ExportPolicy

    for mode, want in (("all", {"__all__", "country=c0"}), ("models", {"__all__"}),
                       ("none", set())):
        policy = ExportPolicy(from_dict({"metrics": {"export": {"bins": mode}}}))
        assert {s for s in ("__all__", "country=c0") if policy.keep_bins(s)} == want


def test_unknown_family_names_are_config_errors() -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"metrics": {"export": {"families": ["ece", "ecee"],
                                          "segment_families": ["nope"]}}})
    assert "metrics.export.families[1]: unknown family 'ecee'" in e.value.problems
    assert "metrics.export.segment_families[0]: unknown family 'nope'" in e.value.problems
    assert "ece_upper" in FAMILIES and "score_psi" in FAMILIES


class Ticking(Collector):
    """A per-request family that changes between requests (like the process counters)."""

    def __init__(self) -> None:
        self.n = 0

    def collect(self) -> Any:
        self.n += 1
        yield CounterMetricFamily("calmon_ticks", "requests", value=self.n)


@pytest.mark.parametrize("accept", ["", OM])
def test_gzip_round_trips_and_the_shared_part_is_rendered_once(accept: str) -> None:
    engine = fed_engine()
    snap = Refresher(engine).update(full=True)
    windows = WindowCollector(lambda: snap, engine.cfg)
    tick = Ticking()
    expo = Exposition(windows, lambda: snap.serial, [tick])
    ctype, enc, parts = expo.render(accept, "")
    plain = b"".join(parts)
    ctype_gz, enc_gz, gz_parts = expo.render(accept, "deflate, gzip;q=0.9")
    assert enc is None and enc_gz == "gzip" and ctype == ctype_gz
    unzipped = gzip.decompress(b"".join(gz_parts))
    # the same body but for the per-request counter
    assert unzipped == plain.replace(b"calmon_ticks_total 1.0", b"calmon_ticks_total 2.0")
    assert len(b"".join(gz_parts)) < len(plain) / 3
    if accept == OM:
        assert plain.endswith(b"# EOF\n") and plain.count(b"# EOF") == 1
    text = unzipped.decode()
    if accept == OM:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
        names = {f.name for f in om(text)}
    else:
        names = {f.name for f in text_string_to_metric_families(text)}
    assert {"calmon_ece", "calmon_ece_upper", "calmon_ticks"} <= names
    # concurrent scrapes of one snapshot: one render of the shared part
    before = expo.builds
    threads = [threading.Thread(target=expo.render, args=(accept, "gzip")) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert expo.builds == before


def test_reliability_filters_pages_and_junk_queries_share_a_bounded_cache() -> None:
    engine = fed_engine({"recalibration": {"min_samples": 10}})
    snap = Refresher(engine).update(full=True)
    page = reliability.Page(engine.cfg, lambda: snap)
    server = HttpServer("127.0.0.1", 0, new_registry(), lambda: True,
                        lambda: {}, {"/reliability": page}, page_cache_s=60.0)
    with server:
        code, body = http_get(server.port, "/reliability?model=m1&segment=country%3Dc2")
        assert code == 200
        assert body.count(b"<section") == 1
        assert b'data-model="m1" data-segment="country=c2"' in body
        code, body = http_get(server.port, "/reliability?model=m0")
        sections = body.count(b'data-model="m0"')
        assert sections == 4 and b'data-model="m1"' not in body  # __all__ + 3 countries
        assert b'class="model' in body  # the picker names both models
        assert b">m1</a>" in body
        builds = server.page_cache.builds
        for i in range(64):
            code, _ = http_get(server.port, f"/reliability?junk{i}={i}&utm=x{i}")
            assert code == 200
        assert server.page_cache.builds == builds + 1  # all the same page
        assert len(server.page_cache._cache) <= 3


def test_reliability_lists_the_worst_series_first_and_pages_the_rest() -> None:
    engine = fed_engine({"recalibration": {"min_samples": 10}})
    snap = Refresher(engine).update(full=True)
    rows = [r for r in snap.rows if r.window == "7d" and r.stats.samples]
    size = reliability.PAGE_SIZE
    try:
        reliability.PAGE_SIZE = 3
        pages = [reliability.page(engine.cfg, snap, None, {"page": [str(n)]})[2]
                 for n in (1, 2, 3)]
    finally:
        reliability.PAGE_SIZE = size
    import re
    shown = re.findall(rb'data-model="([^"]+)" data-segment="([^"]+)"', b"".join(pages))
    assert len(shown) == len(rows) == 8  # 2 models x (__all__ + 3 countries), each once
    key = {(r.model, r.segment): (r.stats.ece_lower, r.stats.ece) for r in rows}
    got = [key[(m.decode(), s.decode())] for m, s in shown]
    assert got == sorted(got, reverse=True)
    assert b"class=next" in pages[0] and b"class=prev" in pages[2]
    assert b"class=next" not in pages[2]


@pytest.mark.parametrize("export", [{}, {"families": ["ece", "smece"], "windows": ["24h"]}])
def test_the_direct_rendering_equals_prometheus_clients_encoders(export) -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    engine = Engine(from_dict({"segments": {"slices": [["country"]]},
                               "metrics": {"export": export}}))
    raws = []
    for i in range(300):
        model = 'quo"te\\back' if i % 2 else "plain"
        raws += [P(f"{i}", T0 + i, model=model, prob=(i % 97) / 97,
                   segment={"country": "a\\b" if i % 3 else 'x"y'}), L(f"{i}", i % 2)]
    assert engine.feed(raws) == []
    snap = Refresher(engine).update(full=True)
    windows = WindowCollector(lambda: snap, engine.cfg)

    class Only:
        def collect(self) -> Any:
            return windows.collect()

    assert windows.render(False) == generate_latest(Only())  # type: ignore[arg-type]
    assert windows.render(True) + b"# EOF\n" == om_latest(Only())  # type: ignore[arg-type]
