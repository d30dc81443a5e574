"""What the engine forgot of a model, told to every reader that keeps state of its own.

The engine forgets a model at once in two cases: it was dropped as idle (contract §2
"Capacity frees itself"), or it took a new class count (a class reset). Readers that
keep per-model state beside the engine (the statistics refresher, the recalibration
policy and loop, the process counters) must forget the same, or they keep a dropped
model's series for ever or apply an old-kind calibrator to new-kind samples. Each
reader holds a ``Cursor`` and takes what was forgotten since it last looked; nobody
guesses from names or shapes.
"""

from __future__ import annotations

import threading
from typing import Protocol

DROPPED = "dropped"  # idle: the model's slot is free, its name may come back fresh
RESET = "reset"  # a new class count: what it kept under the old one is gone

LIMIT = 65_536  # entries kept; a reader further behind re-syncs with everything


class Journal:
    """Forgotten models in order, (sequence number, model, why); appended by the thread
    that feeds the engine, read by any thread through its own ``Cursor``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[tuple[int, str, str]] = []
        self._next = 0  # the sequence number of the next entry
        self._floor = 0  # entries before this were trimmed or lost (a restore)

    def add(self, model: str, why: str) -> None:
        with self._lock:
            self._entries.append((self._next, model, why))
            self._next += 1
            if len(self._entries) > LIMIT:
                del self._entries[:len(self._entries) - LIMIT]
                self._floor = self._entries[0][0]

    def restored(self) -> None:
        """The engine's state was replaced whole: every reader re-syncs."""
        with self._lock:
            self._entries.clear()
            self._floor = self._next = self._next + 1

    def cursor(self) -> Cursor:
        """A reader's position, at the start: its first ``take`` re-syncs (None)."""
        return Cursor(self, -1)

    def since(self, at: int) -> tuple[list[tuple[str, str]] | None, int]:
        """(model, why) entries from sequence number ``at`` on (None when some of them
        are gone: the reader re-syncs), and the position after them."""
        with self._lock:
            if at < self._floor:
                return None, self._next
            first = self._entries[0][0] if self._entries else self._next
            return [(m, w) for _, m, w in self._entries[at - first:]], self._next


class Cursor:
    def __init__(self, journal: Journal, at: int) -> None:
        self.journal = journal
        self.at = at

    def take(self) -> list[tuple[str, str]] | None:
        """What was forgotten since the last take, oldest first; None when the reader
        must re-sync with what the engine holds now (its first take, after a restore,
        or when it fell more than ``LIMIT`` entries behind)."""
        out, self.at = self.journal.since(self.at)
        return out


class Taking(Protocol):
    """A reader's cursor, as ``Cursor`` (``summed.SummedEngine`` has one of its own)."""

    def take(self) -> list[tuple[str, str]] | None: ...
