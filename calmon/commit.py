"""One commit protocol: what a checkpoint holds, and how it is put back, for every
participant at once (quix-streams' ``checkpointing/checkpoint.py`` is the model).

The participants: the engine (always); the in-process recalibration loop, or, scaled
out, the cluster (the joined batches its sender keeps as an outbox, and the owner's
state); the positions the state reflects; and the process totals, which only a
roll-back puts back (a restart resets Prometheus counters, as it should).

A checkpoint, between two batches, in numbered steps:

1. the dead letters of this state are delivered (else it waits for the next interval:
   writing now could move the offsets past a counted record still in flight);
2. every participant's snapshot, with the positions it reflects (scaled out, the
   joined samples since the last checkpoint become batches kept in this one);
3. written atomically (``CheckpointStore``);
4. the same offsets committed to the group (by the caller, which knows whether its
   partitions are assigned).

``restore`` is all or nothing: a checkpoint one participant refuses leaves every one
of them empty, and the store takes it for corrupt. ``roll_back`` puts every
participant back to the newest checkpoint (or the empty state), totals included, so
a half-applied batch is never kept.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from calmon.cluster.service import Cluster
from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.io.checkpoint import Checkpoint, CheckpointStore
from calmon.io.dead_letter import DeadLetters
from calmon.io.shape import SECTION as SHAPE_SECTION
from calmon.io.shape import of_config
from calmon.io.totals import ProcessTotals
from calmon.recal.loop import Recalibrator

log = logging.getLogger(__name__)

Positions = dict[tuple[str, int], int]


class Commit:
    """The participants of a checkpoint and the three things done to them together."""

    def __init__(self, cfg: Config, store: CheckpointStore, engine: Engine,
                 totals: ProcessTotals, dead_letters: DeadLetters,
                 recal: Recalibrator | None, cluster: Cluster | None) -> None:
        self.cfg = cfg
        self.store = store
        self.engine = engine
        self.totals = totals
        self.dead_letters = dead_letters
        self.recal = recal
        self.cluster = cluster
        self._written: tuple[Any, ...] | None = None  # what the last checkpoint held
        self._totals_at_checkpoint = ProcessTotals()

    def save(self, positions: Positions) -> float | None:
        """Steps 1-3; the time it was written, or None when nothing was (nothing new,
        dead letters in flight, or a disk that refused: retried at the next interval)."""
        recal = self.recal.snapshot() if self.recal is not None else None
        mark = (self.engine.version, tuple(sorted(positions.items())), repr(recal),
                None if self.cluster is None else self.cluster.changes)
        if self.cluster is not None:
            self.cluster.flush()  # what an earlier checkpoint holds and is not acknowledged
        if mark == self._written:
            return None  # nothing new since the last checkpoint: no write, no fsync
        if not self.dead_letters.flush(timeout=5.0):  # 1
            # the producer settles every record within delivery_timeout_ms, delivered or
            # counted failed: the next interval tries again
            log.warning("checkpoint postponed: dead letters not yet delivered")
            return None
        state: dict[str, Any] = {"engine": self.engine.snapshot(),  # 2
                                 SHAPE_SECTION: of_config(self.cfg.kafka.static)}
        totals = self.totals.copy()  # what a roll-back to this checkpoint restores
        if recal is not None:
            state["recal"] = recal
        if self.cluster is not None:
            # the joined samples since the last checkpoint, as batches kept in this one
            # (an outbox): produced once it is written, sent again from it after a crash
            self.cluster.collect(self.engine, positions)
            state["cluster"] = self.cluster.snapshot()
        now = time.time()
        try:
            self.store.save(state, positions, now)  # 3
        except OSError as e:
            log.error("checkpoint failed, will retry: %s", e)
            return None
        self._written = mark
        self._totals_at_checkpoint = totals
        if self.cluster is not None:
            self.cluster.flush()
        return now

    def restore(self, ckpt: Checkpoint) -> None:
        """Every participant from ``ckpt``; whatever one raises (hostile content that got
        past the checksum and the decoder's checks) leaves them all empty, and raises."""
        empty_engine = Engine(self.cfg).snapshot()
        empty_recal = self.recal.snapshot() if self.recal is not None else None
        try:
            self.engine.restore(ckpt.state["engine"])
            if self.recal is not None and "recal" in ckpt.state:
                self.recal.restore(ckpt.state["recal"])
            if self.cluster is not None and isinstance(ckpt.state.get("cluster"), dict):
                self.cluster.restore(ckpt.state["cluster"])
        except Exception:
            self.engine.restore(empty_engine)
            if self.recal is not None and empty_recal is not None:
                self.recal.restore(empty_recal)
            raise

    def roll_back(self) -> Checkpoint | None:
        """Every participant back to the newest checkpoint (or the empty state), the
        process totals included; the checkpoint, whose positions to read again from."""
        ckpt = self.store.load(self.cfg.state.on_corrupt)
        self.engine.restore(ckpt.state["engine"] if ckpt is not None
                            else Engine(self.cfg).snapshot())
        self.totals.restore(self._totals_at_checkpoint)
        if self.recal is not None and ckpt is not None and "recal" in ckpt.state:
            self.recal.restore(ckpt.state["recal"])
        if self.cluster is not None:  # what was sent goes back with the engine
            self.cluster.restore_sender(None if ckpt is None else ckpt.state.get("cluster"))
        self._written = None
        return ckpt
