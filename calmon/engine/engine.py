"""The engine: ``feed(batch)`` in, ``snapshot()``/``restore()``, and a read interface.

Pure Python and numpy: no sockets, files, threads or clocks. One lock guards
the state so the consumer loop, scrapes and the scheduler can share it; readers
only ever get copies or immutable values (``read_state``, ``window_sums``,
``pending_counts``, ``estimates``: what ``calmon.engine.snapshot`` builds its
``Snapshot`` from; ``samples`` for the recalibration).

``counters`` are part of the state (snapshotted, restored, so exactly-once
across restarts; they feed ``/status`` and ``replay``). What a process did since
it started (Prometheus ``_total`` counters) is not state: each feed leaves its
increments in ``last_delta`` for the exporter to add up.

The class is put together from one module per concern, each a class over the state
of ``enginestate.EngineState``: ``admission`` (models and class counts, the batch
through the join), ``settling`` (a batch's end, idle models and segments dropped),
``counting`` (joined samples and arrivals into windows, histograms and buffers),
``reading`` (the read interface) and ``saving`` (``snapshot``/``restore``). This
module keeps the public writing calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from calmon.engine.admission import Admission
from calmon.engine.delta import Delta
from calmon.engine.enginestate import COUNTER_KEYS as COUNTER_KEYS  # for importers
from calmon.engine.enginestate import TOPICS as TOPICS
from calmon.engine.enginestate import Rejected as Rejected
from calmon.engine.estimates import LiveCalibrators
from calmon.engine.keys import mismatches as key_mismatches
from calmon.engine.parsed import Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.reading import Reading
from calmon.engine.reading import ReadState as ReadState  # for importers
from calmon.engine.reading import WindowSums as WindowSums
from calmon.engine.records import Label, Prediction, Raw
from calmon.engine.rows import Row as Row  # its old place, for importers
from calmon.engine.saving import SNAPSHOT_VERSION as SNAPSHOT_VERSION
from calmon.engine.saving import Saving


class Engine(Admission, Reading, Saving):
    """``feed`` in, ``snapshot``/``restore``, and the read interface (see the module)."""

    def feed(self, batch: Iterable[Raw] | RawBatch,
             not_after: float = math.inf) -> list[Rejected]:
        """Parse, join and count one batch. Returns the records that broke the
        contract (already counted), for the dead-letter topic. Never raises on data:
        a raise is a calmon bug, which the daemon isolates by rolling back to its last
        checkpoint and feeding the batch again one record at a time.

        ``not_after``: event times past it are ``bad_ts`` (the daemon passes its wall
        clock + ``kafka.max_clock_skew``; the engine itself has no clock)."""
        raws = batch if isinstance(batch, RawBatch) else RawBatch.of(list(batch))
        self.batch_parser.not_after = not_after
        parsed = self.batch_parser.parse(raws)
        keyed = None if raws.keys is None else key_mismatches(raws, parsed)
        with self.lock:
            self.last_delta = Delta()
            if keyed is not None:
                self.last_delta.key_mismatch.update(predictions=keyed[0], labels=keyed[1])
            return self._consume(parsed, raws)

    def reject(self, raw: Raw, reason: str) -> Rejected:
        """Count a record as invalid without processing it (the daemon's poison list)."""
        with self.lock:
            self.last_delta = Delta()
            self._invalid(raw.kind, reason)
            self.version += 1
            return Rejected(raw.kind, raw.value, raw.source, reason)

    def feed_parsed(self, records: Iterable[Prediction | Label] | Parsed) -> list[Rejected]:
        """``feed`` for records parsed elsewhere (benchmarks, tests)."""
        parsed = records if isinstance(records, Parsed) else Parsed.from_records(records)
        with self.lock:
            self.last_delta = Delta()
            return self._consume(parsed, None)

    def set_changes(self, changes: Mapping[tuple[str, str], float]) -> None:
        """Replace the starts of the current regimes ((model, segment) -> ``change_ts``
        of a drift): the estimation maps fit only samples predicted after them."""
        with self.lock:
            self.changes = MappingProxyType(dict(changes))
            self.version += 1

    def set_calibrators(self, calibrators: LiveCalibrators) -> None:
        """Replace the live calibrators the label-free estimates use."""
        with self.lock:
            self.calibrators = calibrators
            self.version += 1  # the estimates change: readers read them again

    def status(self) -> dict[str, Any]:
        """Counters, pending counts and event time: what /status needs, without a view."""
        with self.lock:
            return {"counters": dict(self.counters), "pending": self.join.pending,
                    "pending_labels": self.join.pending_labels, "now": self.now,
                    "version": self.version}
