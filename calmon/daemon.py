"""``calmon run``: the one owner of the lifecycle.

Start: load the newest good checkpoint, restore the engine, serve HTTP, assign
partitions at the checkpointed offsets. Loop: poll a batch -> ``Engine.feed``
-> dead letters; every ``state.checkpoint_interval`` and at shutdown, between
two batches, checkpoint in numbered steps. Signal handlers only flip a flag;
the loop notices within one poll timeout, so SIGTERM ends well inside 10 s.

Threads, and what each owns:

- the loop thread (the one that calls ``run``) is the only writer of the engine,
  the positions, the checkpoint store and the dead-letter producer. After each
  batch it publishes the positions as an immutable mapping for readers.
- the loop thread also runs the ``Refresher`` (``calmon.engine.snapshot``) between
  batches, within a share of its time (``STATS_CPU_SHARE``): it publishes immutable
  ``Snapshot``s. Between batches, not beside them: a second CPU-bound thread would
  take the GIL from the join at every one of its numpy calls (measured: half the
  join rate at a 25% share), so the join keeps priority this way.
- HTTP threads only read: the latest snapshot (rendered once per snapshot and shared,
  ``io/exposition``), ``Engine.status()``, the published positions, and immutable
  recalibration state. A scrape never computes a statistic.
- the scheduler thread (APScheduler, in ``recal``) reads engine copies the same
  way and owns the recalibration state; the loop takes that state's snapshot
  through ``Recalibrator.snapshot()``, which copies under the recalibrator's lock.
- the consumer runs in a child process (``io/consumer_process``), never in a thread
  that touches state.

A batch the engine raises on (a calmon bug: bad data is only ever counted) is
never checkpointed: the state and offsets roll back to the last checkpoint, the
batch is read again one record at a time, and the record that raises is
dead-lettered as ``internal`` and skipped, so no input can cause a crash loop.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from types import FrameType, MappingProxyType
from typing import Any, Protocol

from prometheus_client.registry import CollectorRegistry

from calmon.cluster.admin import scaled_out
from calmon.cluster.service import Cluster
from calmon.commit import Commit
from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from calmon.engine.snapshot import Refresher
from calmon.errors import ConfigError, StateError
from calmon.group_run import GroupRun, TaskCollector
from calmon.io import landing, reliability, start, webconfig
from calmon.io.calibrator_publisher import CalibratorPublisher
from calmon.io.checkpoint import Checkpoint, CheckpointStore
from calmon.io.consumer_process import ProcessSource
from calmon.io.dead_letter import DeadLetters
from calmon.io.exporter import CalmonCollector, WindowCollector
from calmon.io.exposition import Exposition, new_registry, standard_collectors
from calmon.io.http import HttpServer, Page
from calmon.io.kafka_source import Batch, KafkaSourceError, consumer_lag
from calmon.io.outbox import Outbox
from calmon.io.reading import ReadWatch
from calmon.io.recordlog import RecordLog
from calmon.io.shape import mismatch, move_aside, of_checkpoint, of_config
from calmon.io.source import CoPartitionError, KafkaAuthError, Skip
from calmon.io.statelock import LOCK_NAME, StateLock
from calmon.io.totals import ProcessTotals, dropped_models
from calmon.recal.loop import Recalibrator
from calmon.recal.readmodel import RecalState

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 250
MAX_RECORDS = 5000
ASSIGN_TIMEOUT_S = 5.0
STALL_LOG_INTERVAL_S = 60.0
REFUSED_RETRY_S = 10.0  # topics that stopped co-partitioning: a new consumer process each
# /healthz fails when the running loop has not come round for this long. An iteration
# is at most a poll, one batch and a checkpoint; a (re)assign may block for about
# ASSIGN_TIMEOUT_S + 30 s (consumer process start), so stay well above that.
LOOP_STALL_S = 120.0
# statistics updates take at most this share of the loop thread's time (each update's
# CPU time, then batches only for a while in proportion), and come at most every
# STATS_MIN_PAUSE_S: the join keeps the rest
STATS_CPU_SHARE = 0.25
STATS_MIN_PAUSE_S = 0.5


class RunState(enum.Enum):
    """A daemon runs once: NEW -> STARTING -> RUNNING -> STOPPING -> STOPPED."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Source(Protocol):
    """What the loop needs from a record source (KafkaSource in production)."""

    def assign(self, positions: dict[tuple[str, int], int] | None = None, *,
               from_checkpoint: bool = False) -> Any: ...
    def poll(self, timeout_ms: int = ..., max_records: int = ...) -> Batch: ...
    def commit(self, positions: dict[tuple[str, int], int]) -> bool: ...
    def connected(self) -> bool: ...
    def close(self) -> None: ...


class Daemon:
    """Build with a config; ``run()`` blocks until ``request_stop()`` (or a signal)."""

    def __init__(self, cfg: Config, *, registry: CollectorRegistry | None = None,
                 source: Source | None = None, install_signals: bool = True,
                 rescale: bool = False) -> None:
        self.cfg = cfg
        # a state of another instance shape is moved aside instead of refused (--rescale)
        self.rescale = rescale
        self.engine = Engine(cfg)
        self.store = CheckpointStore(cfg.state.dir)
        self.outbox = Outbox(cfg.kafka)  # the one producer: dead letters and calibrators
        self.dead_letters = DeadLetters(self.outbox)
        self.totals = ProcessTotals()  # Prometheus _total counters: each feed's delta added
        # group mode (§8): tasks per partition, their own loop and checkpoint (group_run)
        self.group = GroupRun(cfg, self.totals, self.dead_letters) if cfg.kafka.group else None
        self.source: Source = source if source is not None else self.group.source if (
            self.group is not None) else ProcessSource(
            cfg.kafka, metadata_timeout_s=ASSIGN_TIMEOUT_S, max_records=MAX_RECORDS,
            longest_window_s=max(w.seconds for w in cfg.metrics.windows))
        self.positions: dict[tuple[str, int], int] = {}
        # what readers see of the positions: replaced, never mutated (see the docstring)
        self.published_positions: Mapping[tuple[str, int], int] = MappingProxyType({})
        self._published_status: dict[str, Any] | None = None
        # the positions the newest checkpoint holds (replaced, never mutated)
        self.checkpoint_positions: Mapping[tuple[str, int], int] = MappingProxyType({})
        self._suspect: set[str] = set()  # sources of a batch the engine raised on
        self._poison: set[str] = set()  # sources of records the engine raises on
        self.state = RunState.NEW
        self.assigned = False
        self._assign_problem: str | None = None  # why the last assignment failed
        self.last_checkpoint: float | None = None
        self.restored = False  # state came from a checkpoint: its positions are the truth
        self._ever_assigned = False
        self._refused: str | None = None  # why the last assignment was refused
        self.said = RecordLog(cfg)  # invalid records and key mismatches, once a minute
        self._stop = threading.Event()
        self._signals = 0
        self._install_signals = install_signals
        # a dropped model's counters go (group mode: a model no task holds)
        self.totals.follow = (dropped_models(self.engine) if self.group is None
                              else self.group.tasks.dropped_models)
        self.stall_after_s = LOOP_STALL_S
        self._beat = time.monotonic()  # the loop's last progress (monotonic, for /healthz)
        self._beat_wall: float | None = None  # the same in Unix time, for the metric
        # statistics as a read model: readers render refresher.latest, never compute
        self.refresher: Refresher = (
            Refresher(self.engine) if self.group is None else self.group.refresher)
        self._stats_next = 0.0  # monotonic time of the next statistics update
        self.reading = ReadWatch(lambda: self.consumer_lag())  # an idle run is said
        self.recal: Recalibrator | None = None
        # scaled out (contract §7): one owner per model recalibrates on every instance's
        # samples; otherwise (one instance, the default) the in-process loop does
        self.cluster: Cluster | None = None
        if scaled_out(cfg):
            # group mode: the tasks' checkpoints send the joined samples (group_run)
            self.cluster = Cluster(cfg, self.engine if self.group is None
                                   else self.group.live, self.dead_letters.send)
        elif cfg.recalibration.enabled:
            topic = cfg.kafka.calibrators_topic
            publish = None if topic is None else CalibratorPublisher(self.outbox, topic)
            self.recal = Recalibrator(cfg, self.engine, publish,
                                      rows=lambda: self.refresher.latest.rows)
        # the checkpoint's participants, saved, restored and rolled back together
        self.commit = Commit(cfg, self.store, self.engine, self.totals, self.dead_letters,
                             self.recal, self.cluster)
        self.registry = registry if registry is not None else new_registry()
        self.exposition, self.pages = self._readers(cfg)
        self.http: HttpServer | None = None

    def _readers(self, cfg: Config) -> tuple[Exposition, dict[str, Page]]:
        """What readers render: the /metrics collectors (registered into ``registry``)
        and the pages."""
        windows = WindowCollector(lambda: self.refresher.latest, cfg)
        collector = CalmonCollector(
            self.engine, lambda: self.last_checkpoint, self._recal_state,
            lag=self.consumer_lag, heartbeat=lambda: self._beat_wall, totals=self.totals,
            dead_letters_failed=lambda: self.dead_letters.dead_letters_failed,
            snapshot=lambda: self.refresher.latest, windows=False,
            statistics_age=self.statistics_age)
        others = [collector, *standard_collectors(),  # process_*, python_info
                  *([] if self.group is None else [TaskCollector(self.group.tasks)])]
        for c in (windows, *others):  # a family registered twice is refused here
            self.registry.register(c)
        exposition = Exposition(windows, lambda: self.refresher.latest.serial, others)
        # the calibrated diagrams: the loop's, or scaled out the owner's (its models only,
        # on every instance's samples)
        cal_bins = (self.recal.calibrated_bins if self.recal is not None else
                    self.cluster.calibrated_bins if self.cluster is not None else None)
        pages: dict[str, Page] = {
            "/": landing.page,
            "/reliability": reliability.Page(
                cfg, lambda: self.refresher.latest, cal_bins,
                calibrated_note=("all instances' buffered samples, on the owner"
                                 if self.cluster is not None else "buffered samples"))}
        return exposition, pages

    # ------------------------------------------------------------ readers

    def ready(self) -> bool:
        return self.unready_reason() is None

    def unready_reason(self) -> str | None:
        """Why /readyz fails, in a sentence, or None when ready."""
        if self.state is not RunState.RUNNING:
            return f"calmon is {self.state.value}"
        if self._refused is not None:
            return self._refused
        if not self.assigned:  # with what the last attempt met, when it failed
            met = self._assign_problem
            return "partitions not assigned yet" + (f": {met}" if met else "")
        if not self.source.connected():
            refused = getattr(self.source, "refused", None)  # a Source may not know why
            because: str | None = refused() if refused is not None else None
            return f"the Kafka broker is not reachable: {because}" if because else (
                "the Kafka broker is not reachable")
        problem = getattr(self.source, "problem", None)  # a Source may not check topics
        why: str | None = problem() if problem is not None else None
        if why:
            return why
        stuck = getattr(self.source, "stuck", None)  # nor know whether its polls fail
        why = stuck() if stuck is not None else None
        return f"the consumer is stuck: {why}" if why else None

    def alive(self) -> bool:
        """False once the running loop has made no progress for ``stall_after_s``."""
        return (self.state is not RunState.RUNNING
                or time.monotonic() - self._beat < self.stall_after_s)

    def statistics_age(self) -> float | None:
        """Age of the expensive statistics being served (None before the first snapshot)."""
        snap = self.refresher.latest
        return None if snap.version < 0 else snap.age(time.time())

    def consumer_lag(self) -> dict[tuple[str, int], int]:
        ends = getattr(self.source, "end_offsets", None)  # a Source may not know them
        lag = consumer_lag(ends(), dict(self.published_positions)) if ends is not None else {}
        if self.cluster is not None:  # the owner's input: its joined-topic partitions
            lag.update(self.cluster.lag)
        return lag

    def _publish(self) -> None:
        """After a batch (or a restore): what /status shows, counters and positions of
        the same moment, replaced whole (see the docstring)."""
        self.published_positions = MappingProxyType(dict(self.positions))
        self._published_status = (self.engine.status() if self.group is None
                                  else self.group.engine_status())

    def status(self) -> dict[str, Any]:
        # counters only, no window view, so polling it is cheap; published by the loop
        # with the positions, so the two always belong together
        s = self._published_status if self._published_status is not None else (
            self.engine.status())
        last = self.last_checkpoint
        return {
            "ready": self.ready(),
            "state": self.state.value,
            "pending": s["pending"],
            "pending_labels": s["pending_labels"],
            "last_checkpoint": (None if last is None else
                                datetime.fromtimestamp(last, UTC).isoformat()),
            "last_checkpoint_timestamp": last,
            "event_time": None if s["now"] == float("-inf") else s["now"],
            "counters": s["counters"],
            # where this run started each partition, and whether it reads (README "Where
            # a run starts"): a run that reads nothing is never silent
            "start": start.as_status(getattr(self.source, "starts", None) or {}),
            "reading": self.reading.status(),
            "estimates": self.refresher.latest.estimate_bases,
            "positions": {f"{t}/{p}": o
                          for (t, p), o in sorted(self.published_positions.items())},
            "checkpoint_positions": {f"{t}/{p}": o for (t, p), o
                                     in sorted(self.checkpoint_positions.items())},
            # which engine state the served statistics reflect ("current": at least the
            # batch of these counters; a calibrator published since bumps the engine's
            # version past the published status's, so equality would never come back)
            "statistics": {"version": self.refresher.latest.version,
                           "current": self.refresher.latest.version >= s["version"],
                           "age_seconds": self.statistics_age()},
            **({} if self.cluster is None else {"recalibration_owner": self.cluster.status()}),
            **({} if self.recal is None else {"recalibration": self.recal.status()}),
            **({} if self.group is None else {"group": self.group.status()}),
        }

    def _recal_state(self) -> RecalState:
        if self.cluster is not None:
            return self.cluster.metrics_state()
        if self.recal is None:
            return RecalState()
        return self.recal.metrics_state()

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Ask the loop to checkpoint and stop; safe from any thread or a signal handler."""
        self._stop.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1 and signum == signal.SIGINT:
            os._exit(130)  # a second Ctrl+C means now
        self._stop.set()

    def run(self) -> int:
        """Run until stopped. Returns the exit code (0 on a clean stop).

        Every resource is entered into one ExitStack, so whatever fails at start or in
        the loop, what was started is stopped, in reverse order: the scheduler, a final
        checkpoint, the consumer, the dead-letter producer, the HTTP server.

        Raises RuntimeError when the daemon has run before (a Daemon runs once);
        ConfigError when the port cannot be bound, or at the first assignment when
        the input topics cannot co-partition; StateError at start when another
        process holds ``state.dir``, when the checkpoint was written by another
        instance shape, or when no checkpoint is usable and ``state.on_corrupt`` is
        ``fail``.
        """
        if self.state is not RunState.NEW:
            raise RuntimeError(f"a Daemon runs once; this one is {self.state.value}")
        self.state = RunState.STARTING
        try:
            with contextlib.ExitStack() as stack:
                if self._install_signals and (threading.current_thread()
                                              is threading.main_thread()):
                    for signum in (signal.SIGTERM, signal.SIGINT):
                        stack.callback(signal.signal, signum, signal.getsignal(signum))
                        signal.signal(signum, self._on_signal)
                # one process per state.dir: a second one exits before it serves or reads
                stack.enter_context(StateLock(self.cfg.state.dir))
                # serving first: /healthz answers while a large state loads, /readyz 503
                self.http = stack.enter_context(self._http_server())
                log.info("serving metrics on %s://%s:%d/metrics",
                         "https" if self.http.tls else "http", self.cfg.server.host,
                         self.http.port)
                stack.callback(self.dead_letters.close)
                stack.callback(self.source.close if self.group is None else self.group.close)
                if self.group is None:
                    self._restore()
                stack.callback(self._final_checkpoint)
                if self.recal is not None:
                    stack.enter_context(self.recal)
                if self.cluster is not None:
                    self.cluster.flush()  # batches a crash left in the checkpoint
                    stack.enter_context(self.cluster)
                stack.callback(setattr, self, "state", RunState.STOPPING)
                self._heartbeat()
                self.state = RunState.RUNNING
                self._loop() if self.group is None else self.group.loop(self)
        finally:
            self.state = RunState.STOPPED
        log.info("stopped cleanly")
        return 0

    def _http_server(self) -> HttpServer:
        host, port = self.cfg.server.host, self.cfg.server.port
        try:
            return HttpServer(host, port, self.registry, self.ready, self.status, self.pages,
                              alive=self.alive, unready_reason=self.unready_reason,
                              web=webconfig.load(self.cfg.server.web_config_file),
                              metrics=self.exposition.render)
        except (OSError, UnicodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise ConfigError([f"server.port: cannot listen on {host}:{port} ({why})"]
                              ) from None

    def refresh_statistics(self) -> None:
        """Between batches: a statistics update when the share allows (see the module
        docstring); a no-op until then."""
        if time.monotonic() < self._stats_next:
            return
        spent = time.thread_time()
        try:
            self.refresher.update()
        except Exception:  # statistics must never stop the loop: the next update retries
            log.exception("refreshing the statistics raised")
        spent = time.thread_time() - spent
        self._stats_next = time.monotonic() + max(
            STATS_MIN_PAUSE_S, spent * (1.0 - STATS_CPU_SHARE) / STATS_CPU_SHARE)

    def _restore(self) -> None:
        moved: list[dict[str, int]] = []

        def use(ckpt: Checkpoint) -> None:
            """Restore from ``ckpt``; whatever it raises leaves the empty state, and the
            store takes the checkpoint for corrupt (``state.on_corrupt`` decides)."""
            saved = of_checkpoint(ckpt.state)
            problem = mismatch(saved, of_config(self.cfg.kafka.static), str(self.store.dir))
            if problem is not None:
                if not self.rescale:
                    raise StateError(problem)
                moved.append(saved)
                return
            self.commit.restore(ckpt)

        ckpt = self.store.load(self.cfg.state.on_corrupt, use=use)
        if moved:
            self._move_aside(moved[0])
            return
        if ckpt is None:
            log.info("no checkpoint in %s: starting from empty state", self.store.dir)
            # after a reset of corrupt state the group's offsets describe the lost state:
            # read from auto_offset_reset instead
            self.restored = self.store.discarded
            return
        self.positions = dict(ckpt.positions)
        self._publish()
        self.checkpoint_positions = self.published_positions
        self.restored = True
        self.last_checkpoint = ckpt.written_at
        log.info("restored checkpoint %d (%d partitions, %d pending)", ckpt.seq,
                 len(self.positions), self.engine.join.pending)

    def _move_aside(self, saved: dict[str, int]) -> None:
        """``--rescale``: the state of another shape is kept aside, never used; this
        shape starts with empty windows at the group's committed offsets."""
        try:
            aside = move_aside(self.store.dir, saved, keep=(LOCK_NAME,))
        except OSError as e:
            raise StateError(f"state.dir: cannot move the state of instance {saved} aside: "
                             f"{e}") from None
        log.warning("--rescale: the state of instance {index: %d, count: %d} moved to %s; "
                    "starting with empty windows from the group's committed offsets",
                    saved["index"], saved["count"], aside)
        self.restored = False

    def _loop(self) -> None:
        interval = self.cfg.state.checkpoint_interval
        next_ckpt = time.monotonic() + interval
        last_warn = -float("inf")
        while not self._stop.is_set():
            self._heartbeat()
            self.refresh_statistics()
            if not self.assigned:
                try:
                    # Partitions missing from a restored checkpoint start at
                    # auto_offset_reset, never at the group's committed offsets: those
                    # may belong to a newer checkpoint that was lost (corrupt, fallen back).
                    self.source.assign(self.positions or None, from_checkpoint=self.restored)
                    self.assigned = self._ever_assigned = True
                    self._refused = self._assign_problem = None
                    log.info("partitions assigned")
                except CoPartitionError as e:
                    log.error("%s", e)
                    if not self._ever_assigned:  # at start: a configuration error
                        raise ConfigError([str(e)]) from None
                    self._refused = str(e)  # later (a re-assignment): unready, retrying
                    self._stop.wait(REFUSED_RETRY_S)
                    continue
                except KafkaAuthError as e:
                    log.error("%s", e)
                    if not self._ever_assigned:  # at start: a configuration error
                        raise ConfigError([str(e)]) from None
                    self._refused = str(e)  # later (rotated credentials): unready, retrying
                    self._stop.wait(REFUSED_RETRY_S)
                    continue
                except KafkaSourceError as e:
                    self._assign_problem = str(e)
                    if time.monotonic() - last_warn >= STALL_LOG_INTERVAL_S:
                        log.warning("cannot assign partitions yet (%s); retrying", e)
                        last_warn = time.monotonic()
                    self._stop.wait(1.0)
                    continue
            try:
                batch = self.source.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS)
            except KafkaSourceError as e:  # the consumer process died: start it again
                log.error("%s; re-assigning from the last processed offsets", e)
                self.assigned = False
                continue
            self.reading.saw(len(batch) + len(batch.skipped))
            if (len(batch) or batch.skipped) and self.process(batch.columns(), batch.skipped):
                self.positions.update(batch.positions)
                self._publish()
            self.reading.check()
            if time.monotonic() >= next_ckpt:
                self.checkpoint()
                next_ckpt = time.monotonic() + interval

    def _heartbeat(self) -> None:
        self._beat, self._beat_wall = time.monotonic(), time.time()

    def process(self, records: RawBatch, skipped: list[Skip] | None = None) -> bool:
        """One poll batch through the engine; rejected records to the dead-letter topic.
        ``skipped``: offsets the source passed without a record (a batch that cannot be
        decoded, a value too large to carry), each counted once under its reason.
        Returns False when the engine raised and the state was rolled back instead."""
        careful = bool(self._suspect) and any(r.source in self._suspect for r in records)
        if not careful:
            try:
                rejected = []
                if len(records):  # (a poll of skipped offsets only has nothing to feed)
                    rejected = self.engine.feed(records, self._not_after())
                    self.totals.add(self.engine.last_delta)
                    if self.engine.last_delta.key_mismatch:
                        self.said.keys(self.engine.last_delta.key_mismatch)
            except Exception:
                log.exception("the engine raised on a batch of %d records; rolling back to "
                              "the last checkpoint to find the record", len(records))
                self._suspect.update(r.source for r in records)
                self._roll_back()
                return False
        else:
            rejected = []
            for r in records:
                if r.source in self._poison:
                    rejected.append(self.engine.reject(r, "internal"))
                    self.totals.add(self.engine.last_delta)
                    continue
                try:
                    rejected.extend(self.engine.feed([r], self._not_after()))
                    self.totals.add(self.engine.last_delta)
                except Exception:
                    log.exception("the engine raises on the record at %s: dead-lettered as "
                                  "internal from now on", r.source)
                    self._poison.add(r.source)
                    self._roll_back()
                    return False
        for rej in rejected:
            self.said.invalid(rej.kind, rej.reason, rej.source)
        for s in skipped or ():
            if not s.reason:  # moved past offsets of a batch counted before
                continue
            kind = (Kind.PREDICTION if s.topic == self.cfg.kafka.predictions_topic
                    else Kind.LABEL)
            at = f"{s.topic}/{s.partition}/{s.first}"
            rej = self.engine.reject(Raw(kind, s.value, None, at), s.reason)
            self.totals.add(self.engine.last_delta)
            rejected.append(rej)
            span = f" to {s.next_offset - 1}" if s.next_offset - s.first > 1 else ""
            self.said.invalid(kind, s.reason, f"{at}{span} ({s.detail})")
        for rej in rejected:
            self.dead_letters.send(rej.value, rej.reason, rej.source)
        return True

    def _not_after(self) -> float:
        """The latest event time a live record may carry: the wall clock plus the
        configured skew. A producer sets the Kafka timestamp too, so that alone cannot
        bound a record from the far future; a replay of the same offsets after a
        restart decides the same for every record not within the skew of the clock."""
        return time.time() + self.cfg.kafka.max_clock_skew

    def _roll_back(self) -> None:
        """Back to the newest checkpoint (or the empty state), process counters
        included, and read again from its offsets: a half-applied batch is never kept."""
        ckpt = self.commit.roll_back()
        self.positions = dict(ckpt.positions) if ckpt is not None else {}
        self._publish()
        self.restored = ckpt is not None or self.restored
        self.assigned = False  # the loop assigns again at these positions

    def checkpoint(self) -> None:
        """Between two batches: the commit protocol's steps 1-3 (``calmon.commit``), then
        (4) the same offsets committed to the group (lag monitoring; a run without a
        checkpoint starts from them)."""
        written = (self.commit.save(self.positions) if self.group is None
                   else self.group.checkpoint())
        if written is None:
            return
        self.last_checkpoint = written
        self.checkpoint_positions = MappingProxyType(dict(self.positions))
        if self.assigned and self.positions:
            self.source.commit(self.positions)  # 4

    def _final_checkpoint(self) -> None:
        # a failure here still closes the rest: ExitStack runs every callback and
        # re-raises afterwards
        self.checkpoint()
