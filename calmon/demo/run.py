"""``calmon demo``: broker, traffic and daemon on this machine, no setup.

Starts the embedded Kafka-compatible broker on a free port, creates the
topics, runs the traffic generator and the daemon (metrics on ``--port``,
recalibration every few seconds), and prints a compact status line per model
plus every recalibration as it happens. Ctrl+C (or ``--duration``) stops the
daemon with a checkpoint, then the traffic, then the broker; the temporary
directory goes too, so nothing is left running or listening.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from calmon import config, logs
from calmon.daemon import Daemon
from calmon.demo import broker as embedded
from calmon.demo.broker import TansuBroker, resolve_binary
from calmon.demo.narrate import Narrator
from calmon.demo.traffic import Traffic
from calmon.engine.metrics import within_interval
from calmon.engine.series import ALL
from calmon.errors import ConfigError

log = logging.getLogger(__name__)

TOPICS = ("predictions", "labels", "dead-letters", "calibrators")
STATUS_EVERY = 5.0


def demo_config(bootstrap: str, port: int, workdir: Path) -> config.Config:
    return config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, "dead_letter_topic": "dead-letters",
                  "calibrators_topic": "calibrators",
                  "client": {"request_timeout_ms": 5000, "reconnect_backoff_max_ms": 1000}},
        "join": {"missing_label": {"value": 0, "after": "5s"}, "label_ttl": "5m"},
        "metrics": {"windows": ["1m", "5m", "1h"]},
        "segments": {"slices": [["country"], ["device"]], "max_values": 10},
        "recalibration": {"interval": "3s", "method": "temperature", "min_samples": 300,
                          "cooldown": "10s", "window": "1m", "buffer": 20000,
                          "per_segment": True,
                          "output_dir": str(workdir / "calibrators"),
                          "triggers": {"ece_above": 0.03}},
        "server": {"host": "127.0.0.1", "port": port},
        "state": {"dir": str(workdir / "state"), "checkpoint_interval": "5s"},
    })


def create_topics(bootstrap: str, partitions: int = 4) -> None:
    embedded.create_topics(bootstrap, TOPICS, partitions)



def ece_cell(raw: float | None, lower: float | None, upper: float | None,
             floor: float | None, calibrated: float | None) -> str:
    """``raw 0.059 [0.031, 0.087] (noise 0.021) -> calibrated 0.074, within noise``: the
    raw ECE with its interval and noise floor (an ECE near its floor is sampling noise,
    not miscalibration), and the calibrated one, said to be within noise when it lies
    inside the raw one's interval (a difference the samples cannot tell)."""
    out = f"raw {raw:.3f}" if raw is not None else "raw   -  "
    if lower is not None and upper is not None:
        out += f" [{lower:.3f}, {upper:.3f}]"
    out += f" (noise {floor:.3f})" if floor is not None else ""
    if calibrated is not None:
        out += f" -> calibrated {calibrated:.3f}"
        if within_interval(calibrated, (lower, upper)):
            out += ", within noise"
    return out

class StatusPrinter:
    """Prints a line per model (and per segment with its own calibrator) every few
    seconds, and each recalibration event at once, told by the ``Narrator``."""

    def __init__(self, daemon: Daemon, traffic: Traffic, out: TextIO) -> None:
        self.daemon = daemon
        self.traffic = traffic
        self.out = out
        self._events = 0
        self._states: tuple[int, dict[tuple[str, str], dict[str, Any]]] = (0, {})
        self.narrator = Narrator(daemon.cfg, self._state_of, daemon.engine.samples,
                                 daemon.engine.now_of)

    def _state_of(self, model: str, segment: str) -> dict[str, Any] | None:
        """A series' state as the last check published it (the snapshot is replaced
        whole by each check: read, never written here)."""
        recal = self.daemon.recal
        if recal is None:
            return None
        snap = recal.policy.snapshot()
        if self._states[0] != id(snap):
            self._states = (id(snap), {(m, sg): st for m, sg, st in snap.get("series", [])})
        return self._states[1].get((model, segment))

    def run(self, stop: threading.Event) -> None:
        next_status = time.monotonic() + STATUS_EVERY
        while not stop.wait(0.5):
            self._recalibrations()
            if time.monotonic() >= next_status:
                self._status()
                next_status += STATUS_EVERY

    def _recalibrations(self) -> None:
        """Every drift alarm and refit outcome, as it happens (from the loop's events)."""
        recal = self.daemon.recal
        if recal is None:
            return
        events = recal.events  # replaced whole by each run: a consistent list
        fresh, self._events = events[self._events:], len(events)
        lines = self.narrator.lines(fresh)
        if lines:
            self.out.write("".join(f"{line}\n" for line in lines))
            self.out.flush()

    def _status(self) -> None:
        view = self.daemon.refresher.latest  # computed off this thread
        window = self.daemon.cfg.metrics.windows[0].name
        cal = {}
        if self.daemon.recal is not None:
            cal = {(m, s, w): v for m, s, w, v in self.daemon.recal.metrics_state().calibrated_ece}
        self.out.write(f"[{time.strftime('%H:%M:%S')}] sent {self.traffic.sent} predictions, "
                       f"{self.traffic.labels_sent} labels; pending {view.pending}\n")
        rows = [r for r in view.rows if r.window == window]
        own = [r for r in rows if r.segment != ALL and recal_live(self.daemon, r.model,
                                                                 r.segment)]
        for row in rows:
            if row.segment != ALL:
                continue
            joined = f"joined {self.daemon.totals.joined.get(row.model, 0):>7}"
            mine = [r for r in own if r.model == row.model]
            more = f" (+{len(mine)} per segment, below)" if mine else ""
            self.out.write(self._row(f"{row.model:<7} {joined}", row, window, cal) + more
                           + "\n")
            for seg in mine:  # per segment where a calibrator is per segment
                self.out.write(self._row(f"  {seg.segment:<20}", seg, window, cal) + "\n")
        for line in self.narrator.open_lines():
            self.out.write(line + "\n")
        self.out.flush()

    def _row(self, head: str, row: Any, window: str, cal: dict[tuple[str, str, str], float]
             ) -> str:
        live = recal_live(self.daemon, row.model, row.segment)
        c = cal.get((row.model, row.segment, window)) if live else None
        st = row.stats
        cell = ece_cell(st.ece, st.ece_lower, st.ece_upper, st.noise_floor, c)
        return (f"  {head}   ECE({window}) {cell}   "
                f"calibrator {('v' + str(live)) if live else '-'}")

    def summary(self) -> None:
        self.out.write("".join(f"{line}\n" for line in self.narrator.summary()))
        self.out.flush()


def recal_live(daemon: Daemon, model: str, segment: str = ALL) -> int | None:
    """The series' own live calibrator version (None: none of its own)."""
    if daemon.recal is None:
        return None
    live = daemon.recal.registry.live(model, segment)
    return None if live is None else live.version


def run_demo(duration: float | None, rate: float, port: int, out: TextIO = sys.stdout) -> int:
    # warnings and errors only; the scheduler's chatter stays out of the terminal
    logs.setup(config.LoggingConfig(level="warning"))
    busy = embedded.port_problem(port)
    if busy is not None:  # said before anything starts, with the demo's own flag
        print(f"calmon demo: cannot listen on 127.0.0.1:{port} ({busy}); another program "
              "(an earlier demo?) holds it: choose another port with --port", file=sys.stderr)
        return 2

    def notice(message: str) -> None:
        out.write(f"calmon demo: {message}\n")
        out.flush()

    binary = resolve_binary(notice)
    workdir = Path(tempfile.mkdtemp(prefix="calmon-demo-"))
    broker = TansuBroker(binary, log=workdir / "broker.log")
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        broker.start()
        create_topics(broker.bootstrap)
        cfg = demo_config(broker.bootstrap, port, workdir)
        daemon = Daemon(cfg)
        traffic = Traffic(broker.bootstrap, "predictions", "labels", rate)
        printer = StatusPrinter(daemon, traffic, out)
        for name, target in (("traffic", traffic.run), ("status", printer.run)):
            t = threading.Thread(target=target, args=(stop,), name=f"calmon-demo-{name}",
                                 daemon=True)
            t.start()
            threads.append(t)
        if duration:
            timer = threading.Timer(duration, daemon.request_stop)
            timer.daemon = True
            timer.start()
        out.write(f"calmon demo: broker {broker.bootstrap}, {rate:g} predictions/s\n"
                  f"  metrics      http://127.0.0.1:{port}/metrics\n"
                  f"  reliability  http://127.0.0.1:{port}/reliability\n"
                  f"  status       http://127.0.0.1:{port}/status\n"
                  f"  calibrators  {cfg.recalibration.output_dir}\n"
                  "ctr drifts after ~10 s, fraud (country=BR) after ~15 s, triage after "
                  "~20 s; search stays calibrated.\nAlarms and recalibrations are printed "
                  "as they happen; an ECE near its noise floor is sampling noise. "
                  "Ctrl+C stops.\n")
        out.flush()
        try:
            code = daemon.run()
        except ConfigError as e:  # the port taken meanwhile: the demo's flag, not the key
            for problem in e.problems:
                print("calmon demo: " + problem.replace(
                    "server.port: ", "") + ("; choose another port with --port"
                                            if problem.startswith("server.port") else ""),
                      file=sys.stderr)
            return 2
        stop.set()  # the status thread is done before the summary is written
        for t in threads:
            t.join(timeout=5)
        printer.summary()
        out.write("calmon demo: stopped.\n")
        return code
    except KeyboardInterrupt:  # Ctrl+C while starting, before the daemon's handler is in
        out.write("calmon demo: interrupted.\n")
        return 130
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
