"""``calmon run`` in group mode (``kafka.instance: group``, contract §8): the daemon's
loop for a member of the consumer group. The daemon keeps its lifecycle (HTTP, signals,
the dead-letter producer, the ExitStack); this module owns the tasks, the group
source and the changelog, and the steps of a group checkpoint:

1. the records held for the tasks are fed, and the dead letters of this state are
   delivered (as ``calmon.commit`` step 1);
2. every changed task's changed sections (``calmon.tasklog``) and positions, and the
   predictions offsets named by the same checkpoints, in one Kafka transaction
   (``Tasks.checkpoint``, which keeps polling the group while it works); the broker
   refuses it from a member whose generation is gone, so a zombie writes nothing. With
   recalibration on, each task's joined samples since its last checkpoint go to
   ``kafka.joined_topic`` in the same transaction (``cluster.group_sender``), read by
   the model's owner (``cluster.service``, as in the static mode).

``state.dir`` holds a cache of each task's committed state (``calmon.io.taskcache``),
written after each checkpoint and read at an assignment only where it is provably the
committed state: the changelog is the state.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from calmon.calibrators.signing import Signer
from calmon.cluster.group_sender import GroupSender
from calmon.cluster.kafka import record_budget
from calmon.config import Config
from calmon.engine.engine import COUNTER_KEYS, Engine
from calmon.engine.snapshot import Refresher
from calmon.engine.summed import SummedEngine
from calmon.errors import ConfigError
from calmon.io import changelog
from calmon.io.consumer_process import group_classes
from calmon.io.dead_letter import DeadLetters
from calmon.io.source import CoPartitionError, KafkaSourceError
from calmon.io.totals import ProcessTotals
from calmon.tasks import RESTORE_BUCKETS, Tasks

if TYPE_CHECKING:
    from calmon.daemon import Daemon

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 250
MAX_RECORDS = 5000
START_RETRY_S = 2.0


class GroupRun:
    """A member's tasks, source and changelog, driven by ``loop`` on the loop thread."""

    def __init__(self, cfg: Config, totals: ProcessTotals, dead_letters: DeadLetters) -> None:
        self.cfg = cfg
        self.dead_letters = dead_letters
        source_cls, changelog_cls = group_classes(cfg.kafka)  # of kafka.library
        self.changelog = changelog_cls(cfg.kafka)
        self.tasks = Tasks(cfg, self.changelog, totals)
        kc = cfg.kafka
        if cfg.recalibration.enabled and kc.joined_topic is not None:
            self.tasks.joined = GroupSender(kc.joined_topic, record_budget(kc),
                                            Signer.from_config(cfg.calibrators))
        self.live = TaskEngines()  # the owner's live calibrators, for every task
        self.source = source_cls(cfg.kafka, self.tasks)
        self.tasks.source = self.source
        self.refresher = Refresher(SummedEngine(cfg, self.tasks.engines))
        self.started = False
        self._daemon: Daemon | None = None  # set by loop

    def start(self) -> None:
        """Subscribe (CoPartitionError at a configuration that cannot work) and make
        the changelog topic when it is missing."""
        partitions = self.source.start()
        changelog.ensure_topic(self.cfg.kafka, partitions)
        self.started = True

    def loop(self, daemon: Daemon) -> None:
        interval = self.cfg.state.checkpoint_interval
        next_ckpt = time.monotonic() + interval
        while not daemon._stop.is_set():
            daemon._heartbeat()
            daemon.refresh_statistics()
            if not self.started and not self._try_start(daemon):
                continue
            self._daemon = daemon
            self._feed(daemon, self.source.poll_chunks(POLL_TIMEOUT_MS, MAX_RECORDS))
            self.live.push(self.tasks.engines())
            if time.monotonic() >= next_ckpt:
                self.checkpoint()
                next_ckpt = time.monotonic() + interval

    def _try_start(self, daemon: Daemon) -> bool:
        try:
            self.start()
        except CoPartitionError as e:
            raise ConfigError([str(e)]) from None
        except KafkaSourceError as e:
            daemon._assign_problem = str(e)
            log.warning("cannot join the group yet (%s); retrying", e)
            daemon._stop.wait(START_RETRY_S)
            return False
        daemon.assigned = daemon._ever_assigned = True
        daemon._assign_problem = None
        return True

    def _feed(self, daemon: Daemon, chunks: list[Any], force: bool = False) -> None:
        rejected = self.tasks.feed(chunks, daemon._not_after(), force=force,
                                   skips=self.source.take_skips())
        for rej in rejected:
            daemon.said.invalid(rej.kind, rej.reason, rej.source)
            self.dead_letters.send(rej.value, rej.reason, rej.source)
        daemon.positions = self.tasks.positions()
        daemon._publish()

    def checkpoint(self) -> float | None:
        """Steps 1-2 of the module docstring; the time it was written, or None."""
        if not self.started or not self.tasks.tasks:
            return None
        if self._daemon is not None:  # what is held is fed: the checkpoint reflects it
            self._feed(self._daemon, [], force=True)
        if not self.dead_letters.flush(timeout=5.0):  # 1
            log.warning("checkpoint postponed: dead letters not yet delivered")
            return None
        return self.tasks.last_checkpoint if self.tasks.checkpoint() else None  # 2

    def close(self) -> None:
        self.source.close()
        self.changelog.close()

    def engine_status(self) -> dict[str, Any]:
        """``Engine.status()`` summed over the tasks (counters, pending, event time)."""
        # every counter, at 0 on a member that owns no task yet (as one instance shows)
        out: dict[str, Any] = {"counters": dict.fromkeys(COUNTER_KEYS, 0), "pending": 0,
                               "pending_labels": 0,
                               "now": float("-inf"), "version": self.refresher.latest.version}
        for engine in self.tasks.engines():
            s = engine.status()
            for k, v in s["counters"].items():
                out["counters"][k] = out["counters"].get(k, 0) + v
            out["pending"] += s["pending"]
            out["pending_labels"] += s["pending_labels"]
            out["now"] = max(out["now"], s["now"])
        return out

    def status(self) -> dict[str, Any]:
        return {"tasks": self.tasks.status(), "rebalances": self.source.rebalances,
                # assigned, paused until their committed offsets can be read
                "waiting": sorted(self.source.unrestored),
                "checkpoints_refused": self.tasks.fenced,
                # restores from state.dir: whole, with the changelog's tail, or not used
                "task_cache": {**self.tasks.cache_use, **self.tasks.cache.status()},
                "changelog_topic": self.cfg.kafka.changelog_topic,
                # committed to the joined topic by this member's checkpoints
                **({} if (j := self.tasks.joined) is None else
                   {"joined_sent": {"batches": j.batches, "samples": j.samples}})}


class TaskEngines:
    """The engine the recalibration owner hands the live calibrators and regime starts
    to (``recal.live.Engineish``), for every task's label-free estimates. The owner's
    thread only keeps the newest; the loop thread, the tasks' one writer, hands them to
    each engine that has not had them (tasks restored since included)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, Any] = {}
        self._serial = 0
        self._given: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()

    def set_calibrators(self, calibrators: Any) -> None:
        self._set("calibrators", calibrators)

    def set_changes(self, changes: Mapping[tuple[str, str], float]) -> None:
        self._set("changes", changes)

    def _set(self, what: str, value: Any) -> None:
        with self._lock:
            self._latest[what] = value
            self._serial += 1

    def push(self, engines: list[Engine]) -> None:
        with self._lock:
            latest, serial = dict(self._latest), self._serial
        for engine in engines:
            if self._given.get(engine, 0) >= serial:
                continue
            if "calibrators" in latest:
                engine.set_calibrators(latest["calibrators"])
            if "changes" in latest:
                engine.set_changes(latest["changes"])
            self._given[engine] = serial


class TaskCollector:
    """calmon_tasks{state}, calmon_restore_seconds, calmon_restored_bytes_total."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks

    def describe(self) -> list[Metric]:
        return list(self._families(None))

    def collect(self) -> list[Metric]:
        return list(self._families(self.tasks))

    @staticmethod
    def _families(tasks: Tasks | None) -> list[Metric]:
        g = GaugeMetricFamily("calmon_tasks", "Tasks (input partitions) this instance owns, "
                              "by state", labels=("state",))
        counts = tasks.counts() if tasks is not None else {"restoring": 0, "running": 0}
        for state, n in sorted(counts.items()):
            g.add_metric([state], n)
        h = HistogramMetricFamily("calmon_restore_seconds",
                                  "Time to restore a task from the changelog")
        if tasks is not None:
            h.add_metric([], [(_le(le), n) for le, n in zip(RESTORE_BUCKETS,
                                                            tasks.restore_counts)],
                         tasks.restore_sum)
        c = CounterMetricFamily("calmon_restored_bytes", "Changelog bytes read by restores",
                                value=tasks.restored_bytes if tasks is not None else 0)
        return [g, h, c]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
