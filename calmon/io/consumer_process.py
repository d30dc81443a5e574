"""The Kafka consumer in a child process, so decoding Kafka and running the engine
use two cores instead of sharing one interpreter lock.

kafka-python spends longer decoding a record batch than calmon spends parsing
and counting it; in one process the two add up. Here a child owns the source of
``kafka.library`` (``make_source``, the one place that picks the library, with
``group_classes`` for group mode) and streams poll results
(plain per-partition columns) through a pipe; the parent (the daemon) builds
``Raw`` records and feeds the engine. With librdkafka the decoding runs in its
own threads, but the pipe still keeps the per-record Python work of the two
sides on two cores. A sender thread in the child keeps the client polling while the previous
batch crosses the pipe; at most ``AHEAD`` poll results wait, so a slow engine
simply makes the child wait and memory stays bounded. Positions travel with
their records, so checkpoints stay exact.

The child ignores SIGINT/SIGTERM (the parent decides when to stop), dies with
the parent (``PR_SET_PDEATHSIG``, and pipe EOF), and is started again by the
daemon through ``assign`` if it ever dies by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from calmon import logs, secrets
from calmon.children import die_with_parent
from calmon.config import KafkaConfig
from calmon.engine.records import Kind
from calmon.io import topic_checks
from calmon.io.reach import unreachable
from calmon.io.source import (
    Batch,
    Chunk,
    ChunkSource,
    CoPartitionError,
    KafkaAuthError,
    KafkaSourceError,
    Position,
    Skip,
    to_batch,
)
from calmon.io.start import Start
from calmon.io.topics import fetch_bytes

if TYPE_CHECKING:
    from calmon.io.changelog import Changelog
    from calmon.io.group_source import GroupSource

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 200
AHEAD = 2  # poll results the child may hold beyond the one crossing the pipe
END_OFFSETS_INTERVAL_S = 10.0  # how often the child fetches end offsets (consumer lag)
REFRESH_INTERVAL_S = 30.0  # how often the child compares the topics' partitions again


def make_source(config: KafkaConfig, *, metadata_timeout_s: float = 30.0) -> ChunkSource:
    """The source of the configured ``kafka.library``."""
    if config.library == "confluent":
        from calmon.io.confluent_source import ConfluentSource  # optional extra calmon[fast]

        return ConfluentSource(config, metadata_timeout_s=metadata_timeout_s)
    from calmon.io.kafka_source import KafkaSource

    return KafkaSource(config, metadata_timeout_s=metadata_timeout_s)


def group_classes(config: KafkaConfig) -> tuple[type[GroupSource], type[Changelog]]:
    """Group mode's source and changelog writer of the configured ``kafka.library`` (the
    group source runs in the loop thread, not here: its rebalance callbacks restore and
    drop the tasks). A restore reads the changelog with kafka-python either way."""
    if config.library == "confluent":
        from calmon.io.confluent_changelog import ConfluentChangelog
        from calmon.io.confluent_group import ConfluentGroupSource

        return ConfluentGroupSource, ConfluentChangelog
    from calmon.io.changelog import Changelog as KafkaPythonChangelog
    from calmon.io.group_source import GroupSource as KafkaPythonGroupSource

    return KafkaPythonGroupSource, KafkaPythonChangelog


class ProcessSource:
    """The daemon's ``Source``: the ``kafka.library`` source running in a child process."""

    def __init__(self, config: KafkaConfig, *, metadata_timeout_s: float = 30.0,
                 max_records: int = 5000, longest_window_s: float | None = None) -> None:
        self._config = config
        # with it, the child checks the input topics' configuration once it has assigned
        self._longest_window_s = longest_window_s
        self._metadata_timeout_s = metadata_timeout_s
        self._max_records = max_records
        self._kinds = {config.predictions_topic: Kind.PREDICTION, config.labels_topic: Kind.LABEL}
        self._proc: Any = None
        self._data: Connection | None = None  # child -> parent: poll results
        self._cmd: Connection | None = None  # parent -> child: commit, close
        self._connected = False
        self._end_offsets: dict[Position, int] = {}  # last fetched by the child
        self._problem: str | None = None  # the child's co-partitioning problem, if any
        self._stuck: str | None = None  # the child's source's stuck(), as last sent
        self._refused: str | None = None  # why the broker refuses the child, as last sent
        self.starts: dict[Position, Start] = {}

    def assign(self, positions: dict[Position, int] | None = None, *,
               from_checkpoint: bool = False) -> list[Position]:
        """Start the child, which assigns and seeks, then streams. Raises
        KafkaSourceError when the child cannot assign (broker down, missing topic),
        CoPartitionError when the topics cannot be split over the instances."""
        self.close()
        down = unreachable(self._config.bootstrap_servers)
        if down is not None:  # said at once, not after the child's metadata timeout
            raise KafkaSourceError(down)
        ctx = mp.get_context("spawn")  # no fork of the HTTP and scheduler threads
        data_parent, data_child = ctx.Pipe(duplex=False)
        cmd_child, cmd_parent = ctx.Pipe(duplex=False)
        level = logging.getLogger("calmon").getEffectiveLevel()
        config = dataclasses.replace(self._config, client=dict(self._config.client))  # picklable
        proc = ctx.Process(
            target=_child, name="calmon-consumer", daemon=True,
            args=(config, positions, from_checkpoint, self._metadata_timeout_s,
                  self._max_records, data_child, cmd_child, level, self._longest_window_s))
        proc.start()
        self._proc = proc
        data_child.close()
        cmd_child.close()
        self._data, self._cmd = data_parent, cmd_parent
        deadline = time.monotonic() + self._metadata_timeout_s + 30.0
        while not data_parent.poll(0.2):
            if not proc.is_alive() or time.monotonic() > deadline:
                self.close()
                raise KafkaSourceError("the consumer process did not start")
        try:
            kind, payload = data_parent.recv()
        except EOFError:
            self.close()
            raise KafkaSourceError("the consumer process died while assigning") from None
        if kind in ("error", "refused", "auth"):
            self.close()
            error = {"refused": CoPartitionError, "auth": KafkaAuthError}.get(kind)
            raise (error or KafkaSourceError)(payload)
        self._connected = True
        self._problem = None
        owned: list[Position] = payload[0]
        self.starts = payload[1]  # where the child starts each partition (calmon.io.start)
        return owned

    def poll(self, timeout_ms: int = 1000, max_records: int = 5000) -> Batch:
        """The next poll result from the child (``max_records`` is the child's).
        Raises KafkaSourceError when the child is gone, so the daemon re-assigns."""
        if self._data is None:
            raise KafkaSourceError("the consumer process is not running")
        try:
            if not self._data.poll(timeout_ms / 1000.0):
                return Batch()
            (chunks, self._connected, ends, self._problem, skips, self._stuck,
             self._refused) = self._data.recv()
        except (EOFError, OSError):
            self.close()
            raise KafkaSourceError("the consumer process exited") from None
        if ends:
            self._end_offsets = ends
        batch = to_batch(chunks, self._kinds, columns=True)
        batch.add_skips(skips)
        return batch

    def stuck(self) -> str | None:
        """Why the child's polls have failed for a while with the broker up, or None."""
        return self._stuck if self._proc is not None else None

    def refused(self) -> str | None:
        """Why the broker refuses the child's connections (credentials, certificate)."""
        return self._refused if self._proc is not None and not self._connected else None

    def end_offsets(self) -> dict[Position, int]:
        """The owned partitions' end offsets as the child last fetched them (for lag)."""
        return self._end_offsets

    def problem(self) -> str | None:
        """Why the input topics cannot be split over the instances, as the child last
        found at a metadata refresh (None: they can)."""
        return self._problem

    def commit(self, positions: dict[Position, int]) -> bool:
        """Ask the child to commit (lag monitoring, and where a run without a checkpoint
        starts); does not wait."""
        if self._cmd is None:
            return False
        try:
            self._cmd.send(("commit", dict(positions)))
            return True
        except OSError:
            return False

    def connected(self) -> bool:
        return self._proc is not None and self._connected

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if self._cmd is not None:
            with contextlib.suppress(OSError):
                self._cmd.send(("close", None))
        if proc is not None:
            # drain what the child still writes, or it may block on a full pipe
            deadline = time.monotonic() + 5.0
            while proc.is_alive() and time.monotonic() < deadline:
                try:
                    if self._data is not None and self._data.poll(0.05):
                        self._data.recv()
                except (EOFError, OSError):
                    break
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        for conn in (self._data, self._cmd):
            if conn is not None:
                conn.close()
        self._data = self._cmd = None
        self._connected = False
        self._end_offsets = {}
        self._stuck = None
        self._refused = None


def _child(config: KafkaConfig, positions: dict[Position, int] | None, from_checkpoint: bool,
           metadata_timeout_s: float, max_records: int, data: Connection, cmd: Connection,
           level: int, longest_window_s: float | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()  # and pipe EOF ends it where that is not available
    parent = os.getppid()
    logs.setup_child(level)  # the parent's format (text or JSON), secrets masked
    secrets.register_config(dict(config.client))
    source = make_source(config, metadata_timeout_s=metadata_timeout_s)
    try:
        try:
            owned = source.assign(positions, from_checkpoint=from_checkpoint)
        except CoPartitionError as e:
            data.send(("refused", str(e)))
            return
        except KafkaAuthError as e:
            data.send(("auth", str(e)))
            return
        except KafkaSourceError as e:
            data.send(("error", str(e)))
            return
        data.send(("assigned", (owned, getattr(source, "starts", {}))))
        if longest_window_s is not None:  # warnings only, beside the polling
            threading.Thread(target=topic_checks.check, args=(config, longest_window_s),
                             name="calmon-topic-checks", daemon=True).start()
        # a sender thread, so polling goes on while the previous batch crosses the pipe
        # (sending mostly waits in write(2), outside the GIL); the queue bounds read-ahead
        outbox: queue.Queue[Any] = queue.Queue(maxsize=AHEAD)
        sender = threading.Thread(target=_send_all, args=(outbox, data), daemon=True)
        sender.start()
        next_ends = time.monotonic()
        next_refresh = time.monotonic() + REFRESH_INTERVAL_S
        problem: str | None = None
        carry = fetch_bytes(config.max_record_bytes)  # the largest value sent across
        refused = getattr(source, "refused", lambda: None)  # not every library can tell
        while os.getppid() == parent and sender.is_alive():
            while cmd.poll():
                what, arg = cmd.recv()
                if what == "close":
                    return
                source.commit(arg)
            chunks = source.poll_chunks(POLL_TIMEOUT_MS, max_records)
            skips = source.take_skips()
            chunks = _drop_huge(chunks, carry, skips)
            ends: dict[Position, int] = {}
            if time.monotonic() >= next_ends:
                ends = source.end_offsets() if source.connected() else {}
                next_ends = time.monotonic() + END_OFFSETS_INTERVAL_S
            if time.monotonic() >= next_refresh:
                problem = source.refresh()
                next_refresh = time.monotonic() + REFRESH_INTERVAL_S
            while sender.is_alive():  # blocks while the parent is AHEAD batches behind
                try:
                    outbox.put((chunks, source.connected(), ends, problem, skips,
                                source.stuck(), refused()), timeout=0.5)
                    break
                except queue.Full:
                    continue
    except (EOFError, BrokenPipeError, OSError):
        pass  # the parent went away
    finally:
        source.close()


def _drop_huge(chunks: list[Chunk], carry: int, skips: list[Skip]) -> list[Chunk]:
    """Values over ``carry`` bytes (oversize anyway) stay here: each becomes an
    ``oversize`` Skip, so neither the pipe nor the daemon ever holds one. Oversize
    values up to ``carry`` still cross, to be dead-lettered unchanged."""
    out: list[Chunk] = []
    for chunk in chunks:
        topic, partition, values, stamps, offsets, keys = chunk
        if max(map(len, filter(None, values)), default=0) <= carry:  # in C: the common case
            out.append(chunk)
            continue
        big = [i for i, v in enumerate(values) if v is not None and len(v) > carry]
        for i in big:
            skips.append(Skip(topic, partition, offsets[i], offsets[i] + 1, "oversize",
                              f"a value of {len(values[i] or b'')} bytes", None))
        drop = set(big)
        keep = [i for i in range(len(values)) if i not in drop]
        if keep:
            out.append((topic, partition, [values[i] for i in keep],
                        [stamps[i] for i in keep], [offsets[i] for i in keep],
                        [keys[i] for i in keep]))
    return out


def _send_all(outbox: queue.Queue[Any], data: Connection) -> None:
    try:
        while True:
            data.send(outbox.get())
    except (BrokenPipeError, OSError):
        pass  # the parent went away: the polling loop sees the thread end
