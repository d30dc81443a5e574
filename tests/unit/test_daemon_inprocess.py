"""The daemon in-process, over a ``ListSource``: roll-back on an engine bug, checkpoint and
restore, published positions. Milliseconds, no broker."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calmon.config import from_dict
from calmon.daemon import Daemon
from calmon.engine.engine import Engine
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from calmon.io.exposition import new_registry
from tests.daemon_helpers import wait_until
from tests.fakes import DeadLetterLog, ListSource, partitions_of
from tests.oracle import T0, label_bytes, pred_bytes

DEADLINE_S = 60.0  # generous: a busy 2-core CI machine


def config(tmp_path: Path, **extra: Any):
    return from_dict({
        "server": {"host": "127.0.0.1", "port": 0},
        "state": {"dir": str(tmp_path / "state"), "checkpoint_interval": "1h"},
        "recalibration": {"enabled": False},
        "segments": {"slices": [["country"]]},
        **extra,
    })


def traffic(n: int) -> tuple[list[bytes], list[bytes]]:
    preds = [pred_bytes(f"r{i}", T0 + i, "m", prob=(i % 10) / 10 + 0.05,
                        segment={"country": "US" if i % 3 else "DE"}) for i in range(n)]
    labels = [label_bytes(f"r{i}", i % 2, T0 + i + 1) for i in range(n)]
    return preds, labels


class Running:
    """A daemon's ``run()`` in a thread, stopped (and joined) on exit."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.rc: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.rc = self.daemon.run()

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def wait(self, cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
        def met() -> bool:
            assert self.thread.is_alive(), "the daemon stopped"
            return cond()

        wait_until(met, timeout, what, interval=0.01, detail=self.detail)

    def detail(self) -> str:
        """What a failed wait reports: the daemon's state and, in group mode, its tasks
        and the group's view (so a timeout says which step it stuck at)."""
        d = self.daemon
        out = f"daemon alive {self.thread.is_alive()}, rc {self.rc}, state {d.state.value}"
        if d.group is not None:
            src = d.group.source
            out += (f"\ntasks {d.group.tasks.status()}\nrebalances "
                    f"{getattr(src, 'rebalances', None)}, unrestored "
                    f"{sorted(getattr(src, 'unrestored', ()))}, fenced {d.group.tasks.fenced}")
            out += "\n" + self.stacks()
        return out

    def stacks(self) -> str:
        """Where the daemon's loop and the client library's threads are (a loop blocked
        in a call shows here, where its state alone would show only a stalled group)."""
        frames = sys._current_frames()
        out = []
        for t in threading.enumerate():
            frame = frames.get(t.ident or -1)
            if frame is not None and t is not threading.current_thread():
                out.append(f"thread {t.name}:\n" + "".join(traceback.format_stack(frame)[-12:]))
        return "\n".join(out)

    def __exit__(self, *exc: object) -> None:
        self.daemon.request_stop()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()


def daemon_over(tmp_path: Path, source: ListSource) -> Daemon:
    d = Daemon(config(tmp_path), registry=new_registry(),
               source=source, install_signals=False)
    d.dead_letters = DeadLetterLog()  # type: ignore[assignment]
    return d


def reference_counters(preds: list[bytes], labels: list[bytes], tmp_path: Path
                       ) -> dict[str, int]:
    e = Engine(config(tmp_path))
    e.feed([Raw(Kind.PREDICTION, v) for v in preds] + [Raw(Kind.LABEL, v) for v in labels])
    return dict(e.status()["counters"])


def test_an_engine_bug_rolls_back_and_dead_letters_only_its_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    preds, labels = traffic(40)
    boom = pred_bytes("boom", T0 + 5, "m", prob=0.5)
    source = ListSource(partitions_of([*preds[:20], boom, *preds[20:]], labels), batch=7)
    d = daemon_over(tmp_path, source)
    real_parse = d.engine.batch_parser.parse

    def buggy(raws: RawBatch):  # a parser bug that only this record reaches
        if any(v is not None and b'"boom"' in v for v in raws.values):
            raise RuntimeError("a bug")
        return real_parse(raws)

    monkeypatch.setattr(d.engine.batch_parser, "parse", buggy)
    total = source.total()
    with Running(d) as run:
        run.wait(lambda: sum(d.published_positions.values()) == total, "every record")
    want = reference_counters(preds, labels, tmp_path)
    got = d.engine.status()["counters"]
    assert got["invalid"] == 1
    assert {k: got[k] for k in want if k != "invalid"} == {
        k: v for k, v in want.items() if k != "invalid"}
    assert d.dead_letters.sent == [(boom, "internal", "predictions/0/20")]  # type: ignore
    assert source.assigns >= 3  # rolled back twice: the batch, then the record
    assert d.totals.joined["m"] == 40  # process counters rolled back too


def test_stop_checkpoints_and_a_restart_resumes_exactly(tmp_path: Path) -> None:
    preds, labels = traffic(60)
    source = ListSource(partitions_of(preds[:30], labels[:30]), batch=5)
    d = daemon_over(tmp_path, source)
    with Running(d) as run:
        run.wait(lambda: sum(d.published_positions.values()) == 60, "the first half")
    assert d.status()["positions"] == {"labels/0": 30, "predictions/0": 30}
    source2 = ListSource(partitions_of(preds, labels), batch=5)
    d2 = daemon_over(tmp_path, source2)
    with Running(d2) as run:
        run.wait(lambda: sum(d2.published_positions.values()) == 120, "the rest")
    assert d2.engine.status()["counters"] == reference_counters(preds, labels, tmp_path)
    assert d2.dead_letters.sent == []  # type: ignore[attr-defined]


def test_a_daemon_runs_once_and_stops_what_it_started(tmp_path: Path) -> None:
    preds, labels = traffic(4)
    d = daemon_over(tmp_path, ListSource(partitions_of(preds, labels)))
    with Running(d) as run:
        run.wait(lambda: sum(d.published_positions.values()) == 8, "every record")
        assert d.state.value == "running"
        with pytest.raises(RuntimeError, match="runs once"):
            d.run()  # a second run() while running
    assert d.state.value == "stopped" and run.rc == 0
    assert d.http is not None and d.http._thread is not None
    assert not d.http._thread.is_alive()  # the HTTP server was stopped with it
    with pytest.raises(RuntimeError, match="runs once"):
        d.run()


def test_a_failed_start_stops_the_http_server(tmp_path: Path) -> None:
    preds, labels = traffic(4)
    d = daemon_over(tmp_path, ListSource(partitions_of(preds, labels)))

    def broken_restore() -> None:
        raise OSError("state dir unreadable")

    d._restore = broken_restore  # type: ignore[method-assign]
    with pytest.raises(OSError, match="unreadable"):
        d.run()
    assert d.state.value == "stopped"
    assert d.http is not None and d.http._thread is not None
    assert not d.http._thread.is_alive()


def test_sigterm_checkpoints_and_returns_0(tmp_path: Path) -> None:
    """In the main thread, as ``calmon run`` does: SIGTERM only sets a flag; the loop
    stops, checkpoints and run() returns 0, and puts the previous handlers back."""
    import os
    import signal

    preds, labels = traffic(10)
    d = Daemon(config(tmp_path), registry=new_registry(),
               source=ListSource(partitions_of(preds, labels)), install_signals=True)
    d.dead_letters = DeadLetterLog()  # type: ignore[assignment]
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    reached: list[bool] = []

    def terminate_when_done() -> None:
        try:  # the SIGTERM comes either way, so the run below ends; the test fails after
            wait_until(lambda: sum(d.published_positions.values()) >= 20, DEADLINE_S,
                       "20 positions published", interval=0.01)
            reached.append(True)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_when_done, daemon=True)
    killer.start()
    try:
        assert d.run() == 0
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    killer.join(DEADLINE_S)
    assert reached, f"timed out after {DEADLINE_S}s waiting for 20 positions published"
    assert d.last_checkpoint is not None  # the stop wrote a checkpoint
    restored = daemon_over(tmp_path, ListSource(partitions_of(preds, labels)))
    restored._restore()
    assert restored.engine.status()["counters"] == d.engine.status()["counters"]
    assert dict(restored.positions) == {("predictions", 0): 10, ("labels", 0): 10}


def test_the_exporter_shows_what_the_daemon_counted(tmp_path: Path) -> None:
    """The daemon's registry scraped in-process: the process counters and the window
    gauges equal a plain count of the input."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    preds, labels = traffic(30)
    bad = [b"{not json", b'{"id": "x", "model": "m", "ts": 1, "prob": 7}']
    d = daemon_over(tmp_path, ListSource(partitions_of([*preds, *bad], labels)))
    with Running(d) as run:
        run.wait(lambda: sum(d.published_positions.values()) == 62, "every record")
        # the loop publishes a snapshot of that state soon after
        run.wait(lambda: d.status()["statistics"]["current"], "statistics of that state")
        text = generate_latest(d.registry).decode()
        status = d.status()
    # v5: what every series' label-free estimates are read through (no calibrator: raw)
    raw = {"basis": "raw", "fit_samples": 0, "fit_newest_ts": None}
    assert status["estimates"] == {"m": {"__all__": raw, "country=US": raw,
                                         "country=DE": raw}}
    assert status["start"] == {}  # a list of records has no partitions to say
    assert status["reading"]["idle"] is False
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("calmon_predictions_total", (("model", "m"),))] == 30
    assert samples[("calmon_joined_total", (("model", "m"),))] == 30
    assert samples[("calmon_invalid_records_total",
                    (("reason", "not_json"), ("topic", "predictions")))] == 1
    assert samples[("calmon_invalid_records_total",
                    (("reason", "prob_out_of_range"), ("topic", "predictions")))] == 1
    key = (("model", "m"), ("segment", "__all__"), ("window", "1h"))
    assert samples[("calmon_window_samples", key)] == 30
    positives = sum(i % 2 for i in range(30))
    assert samples[("calmon_observed_rate", key)] == positives / 30
    assert sorted(d.dead_letters.reasons()) == ["not_json", "prob_out_of_range"]  # type: ignore


def test_scrapes_over_http_compute_no_statistic_and_honour_gzip(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Every statistic is computed on the loop thread; /metrics (plain and gzip),
    /reliability and /status requests only render what it published."""
    import gzip
    import urllib.request

    from calmon.engine import metrics, snapshot, stats

    computing: list[str] = []

    def counted(mod: Any, name: str) -> None:
        real = getattr(mod, name)

        def call(*a: Any, **k: Any) -> Any:
            computing.append(threading.current_thread().name)
            return real(*a, **k)
        monkeypatch.setattr(mod, name, call)

    for mod, name in ((snapshot, "expensive_stats"), (snapshot, "plugin_stats"),
                      (stats, "ece_interval_batch"), (metrics, "ece_interval"),
                      (metrics, "smece"), (metrics, "from_vector")):
        counted(mod, name)
    preds, labels = traffic(60)
    d = daemon_over(tmp_path, ListSource(partitions_of(preds, labels)))
    with Running(d) as run:
        run.wait(lambda: sum(d.published_positions.values()) == 120, "every record")
        run.wait(lambda: d.status()["statistics"]["current"], "statistics of that state")
        assert d.http is not None
        base = f"http://127.0.0.1:{d.http.port}"
        loop = set(computing)  # the loop thread's name
        for _ in range(3):
            plain = urllib.request.urlopen(base + "/metrics", timeout=10).read()
            req = urllib.request.Request(base + "/metrics",
                                         headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.headers["Content-Encoding"] == "gzip"
                unzipped = gzip.decompress(resp.read())
            for path in ("/reliability", "/reliability?model=m&junk=1", "/status"):
                assert urllib.request.urlopen(base + path, timeout=10).status == 200
    assert computing and set(computing) == loop, set(computing)  # never an HTTP thread
    assert b"calmon_statistics_age_seconds " in plain
    assert b'calmon_window_samples{model="m",segment="__all__",window="1h"} 60.0' in unzipped
