"""Published calibrators on disk: ``<output_dir>/<model>/<segment>/v<N>.json`` and
``latest.json``, each written temp-then-rename so readers never see half a file.

The files are the source of truth for versions, so versions continue across
restarts and a rollback by the CLI is seen by a running daemon. Names become
directories through ``calibrators.paths.dir_name`` (the watcher's spelling too),
and every path is checked to lie inside ``output_dir`` before anything is written.

``Registry(None)`` keeps documents in memory instead (``replay --recalibrate``
without ``--output-dir``): same versions, nothing written.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from calmon.calibrators import Calibrator, load
from calmon.calibrators.paths import dir_name
from calmon.calibrators.registry import VerifyKeys, read_document
from calmon.calibrators.signing import Signer, keyring
from calmon.calibrators.validate import MAX_BYTES
from calmon.errors import CalibratorError
from calmon.files import atomic_write, write_new

log = logging.getLogger(__name__)

_VERSION = re.compile(r"^v(\d+)\.json$")
# (model, segment, the document as published, its bytes): the document itself, so a
# publisher never parses back what it was handed
Publish = Callable[[str, str, dict[str, Any], bytes], object]


@dataclass(frozen=True)
class Live:
    calibrator: Calibrator
    doc: dict[str, Any]

    @property
    def version(self) -> int:
        return int(self.doc.get("version", 0))


class Registry:
    """``signer`` signs every document published (``calibrators.signing_key``);
    ``verify_keys`` (``calibrators.verify_keys``) make the registry's own reads refuse
    unsigned or forged files, as serving code's watcher does."""

    def __init__(self, output_dir: str | Path | None, publish: Publish | None = None, *,
                 signer: Signer | None = None, verify_keys: VerifyKeys = None,
                 topic_first: bool = False) -> None:
        """``topic_first`` (scaled out, contract §7): the calibrators topic is the truth
        and ``output_dir`` its copy, so a document is written locally only once the
        topic took it (a fenced publish leaves no local version behind)."""
        self.root = None if output_dir is None else Path(output_dir)
        self.publish_to_topic = publish
        self.topic_first = topic_first and publish is not None
        self.signer = signer
        self.verify_keys = keyring(verify_keys)
        self._errors: dict[tuple[str, str], str] = {}  # series -> why its latest.json is refused
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Live | None]] = {}
        self._memory: dict[tuple[str, str], list[dict[str, Any]]] = {}  # root is None
        self._published = 0  # documents published into memory
        self._names_cache: dict[tuple[str, str], tuple[str, str]] = {}

    def dir_of(self, model: str, segment: str) -> Path:
        """The series' directory: exactly two levels below ``output_dir``, always."""
        if self.root is None:
            raise CalibratorError("an in-memory registry has no directories")
        d = self.root / dir_name(model) / dir_name(segment)
        if d.parent.parent != self.root or d.parent.name in ("", ".", ".."):
            raise CalibratorError(f"refusing a calibrator path outside {self.root}")
        return d

    def versions(self, model: str, segment: str) -> list[int]:
        if self.root is None:
            return [int(d["version"]) for d in self._memory.get((model, segment), [])]
        d = self.dir_of(model, segment)
        if not d.is_dir():
            return []
        return sorted(int(m.group(1)) for p in d.iterdir() if (m := _VERSION.match(p.name)))

    def live(self, model: str, segment: str) -> Live | None:
        """The calibrator in ``latest.json`` (re-read when the file changes), or None.
        A bad file counts as none (logged once per change of the file)."""
        if self.root is None:
            with self._lock:
                docs = self._memory.get((model, segment))
                if not docs:
                    return None
                cached = self._cache.get((model, segment))
                if cached is not None and cached[0] == len(docs):
                    return cached[1]
                live_m = Live(load(docs[-1], self.verify_keys), docs[-1])
                self._cache[(model, segment)] = (len(docs), live_m)
                return live_m
        path = self.dir_of(model, segment) / "latest.json"
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        with self._lock:
            cached = self._cache.get((model, segment))
            if cached is not None and cached[0] == mtime:
                return cached[1]
            try:
                doc = read_document(path)
                live: Live | None = Live(load(doc, self.verify_keys), doc)
                self._errors.pop((model, segment), None)
            except (OSError, CalibratorError) as e:
                log.warning("ignoring calibrator %s: %s", path, str(e)[:200])
                self._errors[(model, segment)] = str(e)[:300]
                live = None
            self._cache[(model, segment)] = (mtime, live)
            return live

    @property
    def generation(self) -> int | None:
        """Documents published so far when they live in memory (nothing else changes
        them); None on disk, where a CLI rollback may change them at any time."""
        return self._published if self.root is None else None

    def error(self, model: str, segment: str) -> str | None:
        """Why the series' ``latest.json`` was refused at its last read, or None."""
        return self._errors.get((model, segment))

    def publish(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Give ``doc`` the next version, write it and ``latest.json``, and send it to
        the calibrators topic when one is set. Returns the document as written."""
        model, segment = doc["model"], doc["segment"]
        if self.root is None:
            with self._lock:
                docs = self._memory.setdefault((model, segment), [])
                doc, _ = self._finish({**doc, "version": len(docs) + 1})
                docs.append(json.loads(json.dumps(doc, allow_nan=False)))
                self._published += 1
            return doc
        if self.topic_first:
            return self._publish_topic_first(doc)
        with self._lock:
            d = self.dir_of(model, segment)
            d.mkdir(parents=True, exist_ok=True)
            while True:  # a CLI rollback may publish beside a running daemon
                doc, data = self._finish({**doc, "version": self._next(model, segment)})
                if write_new(d / f"v{doc['version']}.json", data):
                    break
            atomic_write(d / "latest.json", data)
        if self.publish_to_topic is not None:
            self.publish_to_topic(model, segment, doc, data)
        return doc

    def _publish_topic_first(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The owner's publish: numbered from the local copy (read back to the owner's
        marker, and only the owner publishes), committed to the topic, then copied. The
        lock is not held over the network: readers of ``live`` never wait on a broker."""
        model, segment = doc["model"], doc["segment"]
        assert self.publish_to_topic is not None
        with self._lock:
            d = self.dir_of(model, segment)
            doc, data = self._finish({**doc, "version": self._next(model, segment)})
        self.publish_to_topic(model, segment, doc, data)  # raises when fenced
        with self._lock:
            d.mkdir(parents=True, exist_ok=True)
            atomic_write(d / f"v{doc['version']}.json", data)
            atomic_write(d / "latest.json", data)
        return doc

    def _next(self, model: str, segment: str) -> int:
        """The version after the newest file of the series (1 for the first)."""
        existing = self.versions(model, segment)
        return existing[-1] + 1 if existing else 1

    def _finish(self, doc: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Sign the document and check it as serving code will: nothing is published that
        ``load()`` (with this registry's keys) refuses. Returns it and its file bytes."""
        if self.signer is not None:
            doc = self.signer.sign(doc)
        data = (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()
        if len(data) > MAX_BYTES:
            raise CalibratorError(f"a {len(data)}-byte document is over {MAX_BYTES} bytes")
        load(json.loads(data), self.verify_keys)  # CalibratorError: counted failed
        return doc, data

    def read(self, model: str, segment: str, version: int) -> dict[str, Any]:
        """Raises CalibratorError when that version does not exist or is unreadable."""
        if self.root is None:
            for d in self._memory.get((model, segment), []):
                if d["version"] == version:
                    return dict(d)
            raise CalibratorError(f"{model}/{segment}: no version {version}")
        path = self.dir_of(model, segment) / f"v{version}.json"
        doc = read_document(path)
        if not isinstance(doc, dict):
            raise CalibratorError(f"{path}: not a JSON object")
        return doc

    def rollback(self, model: str, segment: str, to_version: int) -> dict[str, Any]:
        """Republish an old version's parameters as a new version."""
        old = self.read(model, segment, to_version)
        load(old, self.verify_keys)  # refuse to republish something that does not load
        doc = {k: v for k, v in old.items() if k not in ("version", "signature")}
        doc.update(trigger="rollback", rollback_of=to_version,
                   fitted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return self.publish(doc)

    def series(self) -> list[tuple[str, str]]:
        """Every (model, segment) with a directory (or, in memory, a document)."""
        if self.root is None:
            return sorted(self._memory)
        if not self.root.is_dir():
            return []
        return [self._names(mdir, sdir)
                for mdir in sorted(p for p in self.root.iterdir() if p.is_dir())
                for sdir in sorted(p for p in mdir.iterdir() if p.is_dir())]

    def entries(self) -> list[dict[str, Any]]:
        """One summary per model/segment: live version, method, all versions."""
        out: list[dict[str, Any]] = []
        for model, segment in self.series():
            live = self.live(model, segment)
            out.append({
                "model": model, "segment": segment,
                "versions": self.versions(model, segment),
                "live": None if live is None else live.version,
                "method": None if live is None else live.doc.get("method"),
                "fitted_at": None if live is None else live.doc.get("fitted_at"),
                "trigger": None if live is None else live.doc.get("trigger"),
                "error": self.error(model, segment),
            })
        return out

    def _names(self, mdir: Path, sdir: Path) -> tuple[str, str]:
        """Model and segment of a series directory: from its document (hashed long names
        cannot be decoded), else by decoding the directory names. Cached per directory
        (a directory's names never change), so a scrape reads no file twice."""
        key = (mdir.name, sdir.name)
        cached = self._names_cache.get(key)
        if cached is not None:
            return cached
        names = unquote(mdir.name), unquote(sdir.name)
        try:
            doc = read_document(sdir / "latest.json")
            if isinstance(doc, dict) and dir_name(str(doc["model"])) == mdir.name and (
                    dir_name(str(doc["segment"])) == sdir.name):
                names = str(doc["model"]), str(doc["segment"])
                self._names_cache[key] = names
        except (CalibratorError, KeyError):
            pass
        return names
