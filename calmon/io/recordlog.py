"""What an invalid record or a mismatched key says in the log: once a minute per
topic and reason, with what to fix (``calmon.hints``), so a flood says it once and a
wrong ``fields:`` mapping of one topic never hides behind the other's."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from calmon import hints
from calmon.config import Config
from calmon.engine.engine import TOPICS
from calmon.engine.records import Kind

log = logging.getLogger(__name__)

INTERVAL_S = 60.0  # an invalid record is logged at most once per reason per minute


class RecordLog:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._keys: dict[str, float] = {}  # topic -> monotonic time last logged
        self._invalid: dict[tuple[str, str], float] = {}  # (topic, reason) -> the same

    def keys(self, mismatches: Mapping[str, int]) -> None:
        now = time.monotonic()
        for topic, n in mismatches.items():
            last = self._keys.get(topic)
            if n and (last is None or now - last >= INTERVAL_S):
                self._keys[topic] = now
                log.warning("%d records on the %s topic have a Kafka key that is not their "
                            "id: they may not co-partition with the other topic (key both "
                            "topics by the id's bytes with one partitioner, README \"Scaling "
                            "out\"); counted in calmon_key_mismatch_total", n, topic)

    def invalid(self, kind: Kind, reason: str, source: str) -> None:
        """The first invalid record per (topic, reason) a minute, with what to fix."""
        now = time.monotonic()
        topic = TOPICS[kind]
        last = self._invalid.get((topic, reason))
        if last is None or now - last >= INTERVAL_S:
            self._invalid[(topic, reason)] = now
            tip = hints.hint(self.cfg, topic, reason)
            log.warning("invalid %s record (%s) at %s%s; counted in "
                        "calmon_invalid_records_total, not logged again for this topic and "
                        "reason for %.0fs", topic[:-1], reason, source,
                        f": {tip}" if tip else "", INTERVAL_S)
