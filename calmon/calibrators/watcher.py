"""Follow published calibrators from serving code, and apply the newest good one.

    watcher = CalibratorWatcher("/var/lib/calmon/calibrators", verify_keys=keys)
    probs = watcher.apply("ctr-v3", logits, segment="country=US", input="logit")

Documents are read, parsed, verified and validated off the ``apply()`` path: a
background thread refreshes every ``min_interval`` seconds and swaps in a new
immutable map of parsed calibrators, which ``get``/``apply`` only read. So one
``apply()`` costs the calibrator's arithmetic, whatever is being refreshed beside it.
A watcher on a directory reads what is there before its constructor returns; one on a
topic reads it (``isolation_level: read_committed``, contract §7) from the beginning in
the background (``wait_ready`` waits for that).

A document that is refused (see ``load``) never replaces what is served: the series
keeps its last good calibrator, the refusal is counted (``refusals()``) and logged,
and the other documents of the same scan or poll are applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from calmon.calibrators.base import Calibrator
from calmon.calibrators.paths import dir_name
from calmon.calibrators.registry import VerifyKeys, load, parse_document, read_document
from calmon.calibrators.scores import (
    BINARY_INPUTS,
    INPUTS,
    finalize,
    not_probabilities,
    to_probs,
)
from calmon.calibrators.signing import keyring
from calmon.calibrators.validate import MAX_VERSION_STEP
from calmon.errors import CalibratorError
from calmon.names import ALL

log = logging.getLogger(__name__)

safe_name = dir_name  # the publisher's spelling (calibrators.paths), kept under its old name

MIN_SLEEP = 0.05  # the refresh thread's shortest pause (min_interval=0 means "as often")
POLL_MS = 100  # one poll of the topic waits at most this long for records


class Held(NamedTuple):
    version: int
    calibrator: Calibrator
    doc: Mapping[str, Any]


class CalibratorWatcher:
    """Serve the newest good calibrator per (model, segment) from a directory written by
    calmon (``recalibration.output_dir``) or from ``kafka.calibrators_topic``.

    ``verify_keys`` (``[{"id", "public_key"}]``, as ``calibrators.verify_keys``): refuse
    documents that are not signed by one of them. ``background=False`` runs no thread:
    then only ``refresh()`` reads documents (tests, or a loop of your own).
    Raises CalibratorError for bad ``verify_keys``, ValueError for neither or both of
    ``directory`` and ``topic``.
    """

    def __init__(self, directory: str | Path | None = None, *, topic: str | None = None,
                 bootstrap_servers: str | list[str] | None = None, min_interval: float = 1.0,
                 consumer_settings: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 verify_keys: VerifyKeys = None, background: bool = True) -> None:
        if (directory is None) == (topic is None):
            raise ValueError("give exactly one of directory or topic")
        self.directory = None if directory is None else Path(directory)
        self.topic = topic
        self.min_interval = min_interval
        self.clock = clock
        self.verify_keys = keyring(verify_keys)
        self._next = -float("inf")
        # what get/apply read: replaced whole by the refresher, never changed in place
        self._live: dict[tuple[str, str], Held] = {}
        self._kinds: dict[str, str] = {}  # model -> input kind of its documents, or declared
        self._mtimes: dict[Path, int] = {}
        self._refused: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._lock = threading.Lock()  # one refresh at a time (the consumer is not shared)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._ends: dict[Any, int] | None = None
        if topic is not None:
            from kafka import KafkaConsumer

            # read_committed: a fenced owner's aborted publish is never served (§7)
            settings = {"isolation_level": "read_committed", **(consumer_settings or {})}
            self._consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers,
                                           enable_auto_commit=False, group_id=None,
                                           **settings)
        else:
            self.refresh(force=True)  # serves what is there from the first apply()
        if background:
            self._thread = threading.Thread(target=self._run, name="calibrator-watcher",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ refreshing

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh(force=True)
            except Exception:  # the refresher never dies: serving keeps what it has
                log.exception("calibrator refresh failed")
            self._stop.wait(max(self.min_interval, MIN_SLEEP))

    def refresh(self, force: bool = False) -> bool:
        """Read new documents now (in the caller's thread); True when anything changed.
        Without ``force``, at most once per ``min_interval`` of ``clock``."""
        now = self.clock()
        if not force and now < self._next:
            return False
        with self._lock:
            if self._stop.is_set():
                return False
            self._next = now + self.min_interval
            if self.directory is not None:
                changed = self._scan_dir()
                self._ready.set()
                return changed
            return self._poll_topic()

    def _scan_dir(self) -> bool:
        assert self.directory is not None
        if not self.directory.is_dir():
            return False
        offers: list[tuple[str, Mapping[str, Any] | None, str | None]] = []
        for latest in sorted(self.directory.glob("*/*/latest.json")):
            try:
                mtime = latest.stat().st_mtime_ns
            except OSError:
                continue
            if self._mtimes.get(latest) == mtime:
                continue
            self._mtimes[latest] = mtime  # a bad file is retried when it changes
            where = f"{latest.parent.parent.name}/{latest.parent.name}"
            try:
                doc = read_document(latest)
            except CalibratorError as e:
                offers.append((where, None, str(e)))
                continue
            if isinstance(doc, Mapping) and not (
                    dir_name(str(doc.get("model"))) == latest.parent.parent.name
                    and dir_name(str(doc.get("segment"))) == latest.parent.name):
                offers.append((where, None, f"{latest}: names another model or segment"))
                continue
            offers.append((where, doc, None))
        return self._offer_all(offers)

    def _assign(self) -> bool:
        """Assign every partition of the topic from the beginning, once it exists."""
        from kafka import TopicPartition

        parts = self._consumer.partitions_for_topic(self.topic)
        if not parts:
            return False
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self._ends = dict(self._consumer.end_offsets(tps))  # the last stable offsets
        return True

    def _poll_topic(self) -> bool:
        if self._ends is None and not self._assign():
            return False
        offers: list[tuple[str, Mapping[str, Any] | None, str | None]] = []
        batches = self._consumer.poll(timeout_ms=POLL_MS)
        for records in batches.values():
            for rec in records:
                if rec.value is None:  # a tombstone
                    continue
                where = _key_text(rec.key)
                try:
                    doc = parse_document(rec.value)
                except CalibratorError as e:
                    offers.append((where, None, f"offset {rec.offset}: {e}"))
                    continue
                if isinstance(doc, Mapping) and "model" not in doc and "segment" not in doc:
                    continue  # a marker of the publishing owner, not a document (§7)
                if isinstance(doc, Mapping) and rec.key is not None and (
                        rec.key != f"{doc.get('model')}/{doc.get('segment')}".encode(
                            "utf-8", "surrogatepass")):
                    # compaction keeps one record per key: a document under another
                    # series' key could outlive that series' own documents
                    offers.append((where, None, f"offset {rec.offset}: keyed {where!r}, "
                                                "not <model>/<segment> of the document"))
                    continue
                offers.append((where, doc, None))
        changed = self._offer_all(offers)
        if not self._ready.is_set() and self._ends is not None and all(
                self._consumer.position(tp) >= end for tp, end in self._ends.items()):
            self._ready.set()
        return changed

    def _offer_all(self, offers: Iterable[tuple[str, Mapping[str, Any] | None, str | None]]
                   ) -> bool:
        """Load each document; swap in one new map with every one that was accepted."""
        live = dict(self._live)
        kinds = dict(self._kinds)
        changed = False
        for where, doc, error in offers:
            if doc is not None:
                try:
                    held = self._accept(doc, live, kinds)
                except CalibratorError as e:
                    error = str(e)
                else:
                    if held is not None:
                        key = (held.doc["model"], held.doc["segment"])
                        live[key] = held
                        kinds[key[0]] = held.calibrator.input
                        changed = True
                    continue
            with self._count_lock:
                self._refused[where] += 1
            log.warning("refusing calibrator %s: %s", where, (error or "")[:300])
        if changed:
            self._live = live
            self._kinds = kinds
        return changed

    def _accept(self, doc: Mapping[str, Any], live: Mapping[tuple[str, str], Held],
                kinds: Mapping[str, str]) -> Held | None:
        """The document to serve, None when it is not newer than what is served (a
        replay), or CalibratorError."""
        if not isinstance(doc, Mapping):
            raise CalibratorError("a calibrator document must be a JSON object")
        model, segment = doc.get("model"), doc.get("segment")
        kind = kinds.get(model) if isinstance(model, str) else None
        cal = load(doc, self.verify_keys, input=kind)
        version = int(doc["version"])
        held = live.get((str(model), str(segment)))
        if held is not None:
            if version <= held.version:
                return None
            if version > held.version + MAX_VERSION_STEP:
                raise CalibratorError(f"version {version} jumps more than {MAX_VERSION_STEP} "
                                      f"past the served {held.version}")
        return Held(version, cal, doc)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the documents there were at start have been read (a directory: at
        once; a topic: up to its end offsets at assignment), False after ``timeout``."""
        return self._ready.wait(timeout)

    # ------------------------------------------------------------------ serving

    def _held(self, model: str, segment: str) -> Held | None:
        live = self._live  # one read: a consistent map even while the refresher swaps
        return live.get((model, segment)) or live.get((model, ALL))

    def get(self, model: str, segment: str = ALL) -> Calibrator | None:
        """The newest calibrator for the segment, else the model's, else None."""
        held = self._held(model, segment)
        return None if held is None else held.calibrator

    def version(self, model: str, segment: str = ALL) -> int | None:
        held = self._held(model, segment)
        return None if held is None else held.version

    def apply(self, model: str, scores: Any, segment: str = ALL,
              input: str | None = None) -> np.ndarray:
        """Calibrated probabilities, each within [1e-7, 1 - 1e-7].

        ``input`` is the kind of ``scores`` (prob, logit, probs, logits); a calibrator for
        another kind raises CalibratorError. Without a calibrator for the model, the
        model's own probability: sigmoid/softmax of logits, probabilities as they are.
        Without ``input`` the kind is the calibrator's (or of the model's documents);
        when nothing says it, probabilities are assumed, and scores that cannot be
        probabilities raise CalibratorError rather than being clipped into some.
        """
        if input is not None and input not in INPUTS:
            raise CalibratorError(f"input must be one of {', '.join(INPUTS)}, got {input!r}")
        held = self._held(model, segment)
        if held is not None:
            cal = held.calibrator
            if input is not None and input != cal.input:
                raise CalibratorError(f"{model}: the calibrator takes {cal.input!r} scores, "
                                      f"not {input!r}")
            return cal.apply(scores)
        if input is not None:
            if model not in self._kinds:  # what later documents of this model must fit
                self._kinds = {**self._kinds, model: input}
            return finalize(to_probs(scores, input))
        return finalize(to_probs(scores, self._guess(model, scores)))

    def _guess(self, model: str, scores: Any) -> str:
        known = self._kinds.get(model)
        if known is not None:
            return known
        try:
            arr = np.asarray(scores, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise CalibratorError(f"scores are not a numeric array: {exc}") from None
        kind = BINARY_INPUTS[0] if arr.ndim == 1 else "probs"
        if not_probabilities(arr):
            raise CalibratorError(f"{model}: no calibrator, and these scores are not "
                                  "probabilities: pass input='logit' or 'logits'")
        return kind

    def refusals(self) -> dict[str, int]:
        """Refused documents so far, by ``<model>/<segment>`` (the record key or the
        directory's names)."""
        with self._count_lock:
            return dict(self._refused)

    @property
    def refused(self) -> int:
        return sum(self.refusals().values())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def __enter__(self) -> CalibratorWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key_text(key: bytes | None) -> str:
    if key is None:
        return "?"
    return key[:300].decode("utf-8", "replace")

