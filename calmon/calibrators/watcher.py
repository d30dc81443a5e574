"""Follow published calibrators from serving code, and apply the newest one.

    watcher = CalibratorWatcher("/var/lib/calmon/calibrators")     # or topic=..., bootstrap=...
    probs = watcher.apply("ctr-v3", logits, segment="country=US")  # falls back to __all__

No threads: every ``get``/``apply`` refreshes at most once per ``min_interval``
seconds (a few ``stat`` calls, or one non-blocking poll of the topic), so it
fits any serving loop. Without a calibrator, ``apply`` is the identity on
probabilities.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from calmon.calibrators.base import Calibrator
from calmon.calibrators.paths import dir_name
from calmon.calibrators.registry import load, parse_document, read_document
from calmon.calibrators.scores import to_probs
from calmon.engine.series import ALL
from calmon.errors import CalibratorError

log = logging.getLogger(__name__)


safe_name = dir_name  # the publisher's spelling (calibrators.paths), kept under its old name


class CalibratorWatcher:
    def __init__(self, directory: str | Path | None = None, *, topic: str | None = None,
                 bootstrap_servers: str | list[str] | None = None, min_interval: float = 1.0,
                 consumer_settings: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if (directory is None) == (topic is None):
            raise ValueError("give exactly one of directory or topic")
        self.directory = None if directory is None else Path(directory)
        self.topic = topic
        self.min_interval = min_interval
        self.clock = clock
        self._next = -float("inf")
        self._live: dict[tuple[str, str], tuple[int, Calibrator, dict[str, Any]]] = {}
        self._mtimes: dict[Path, int] = {}
        self._consumer: Any = None
        if topic is not None:
            from kafka import KafkaConsumer, TopicPartition

            self._consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers,
                                           enable_auto_commit=False, group_id=None,
                                           **(consumer_settings or {}))
            parts = self._consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            self._consumer.assign(tps)
            self._consumer.seek_to_beginning(*tps)

    def refresh(self, force: bool = False) -> bool:
        """Pick up new calibrators now; True when anything changed."""
        now = self.clock()
        if not force and now < self._next:
            return False
        self._next = now + self.min_interval
        return self._scan_dir() if self.directory is not None else self._poll_topic()

    def _scan_dir(self) -> bool:
        assert self.directory is not None
        changed = False
        if not self.directory.is_dir():
            return False
        for latest in self.directory.glob("*/*/latest.json"):
            try:
                mtime = latest.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if self._mtimes.get(latest) == mtime:
                continue
            try:
                changed |= self._offer(read_document(latest))
            except (OSError, CalibratorError) as e:
                # a bad file is skipped (and retried when it changes), never raised to serving
                log.warning("skipping calibrator %s: %s", latest, str(e)[:200])
            self._mtimes[latest] = mtime
        return changed

    def _poll_topic(self) -> bool:
        changed = False
        batches = self._consumer.poll(timeout_ms=0)
        for records in batches.values():
            for rec in records:
                try:
                    changed |= self._offer(parse_document(rec.value))
                except (ValueError, TypeError, CalibratorError) as e:
                    log.warning("skipping calibrator record at offset %s: %s",
                                getattr(rec, "offset", "?"), str(e)[:200])
        return changed

    def _offer(self, doc: dict[str, Any]) -> bool:
        """Raises CalibratorError for anything that is not a calibrator document."""
        try:
            key = (str(doc["model"]), str(doc.get("segment", ALL)))
            version = doc.get("version", 0)
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise ValueError(f"version must be a non-negative integer, got {version!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CalibratorError(f"not a calibrator document: {e!r}") from None
        held = self._live.get(key)
        if held is not None and held[0] >= version:
            return False
        self._live[key] = (version, load(doc), doc)
        return True

    def get(self, model: str, segment: str = ALL) -> Calibrator | None:
        """The newest calibrator for the segment, else the model's, else None."""
        self.refresh()
        held = self._live.get((model, segment)) or self._live.get((model, ALL))
        return None if held is None else held[1]

    def version(self, model: str, segment: str = ALL) -> int | None:
        self.refresh()
        held = self._live.get((model, segment)) or self._live.get((model, ALL))
        return None if held is None else held[0]

    def apply(self, model: str, scores: Any, segment: str = ALL,
              input: str | None = None) -> np.ndarray:
        """Calibrated probabilities; identity (scores as probabilities) without a
        calibrator, in which case ``input`` names the score kind (default ``prob``)."""
        cal = self.get(model, segment)
        if cal is None:
            return to_probs(scores, input or "prob")
        return cal.apply(scores)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
