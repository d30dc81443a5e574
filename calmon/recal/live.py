"""The live calibrators of ``output_dir``, read in one walk by the thread that checks
(the in-process loop, or the scaled-out owner), never by a scrape: what the engine's
label-free estimates and score PSI need, and what the version and temperature gauges
show."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from calmon.recal.refit import apply_or_identity
from calmon.recal.registry import Registry

Key = tuple[str, str]  # (model, segment)
# whether a series' live version is set aside (a class reset: it scores the old count)
Aside = Callable[[Key, int], bool]


@dataclass(frozen=True)
class LiveSet:
    # (model, segment) -> (apply(scores, kind), reference bin counts or None, version)
    served: dict[Key, tuple[Any, Any, int]]
    temperatures: dict[Key, float]  # of the temperature calibrators
    changes: dict[Key, float]  # the change_ts each live calibrator was fitted after

    @property
    def versions(self) -> dict[Key, int]:
        return {k: v[2] for k, v in self.served.items()}


def read_live(registry: Registry, aside: Aside | None = None) -> LiveSet:
    served: dict[Key, tuple[Any, Any, int]] = {}
    temps: dict[Key, float] = {}
    changes: dict[Key, float] = {}
    for key in registry.series():
        live = registry.live(*key)
        if live is None or (aside is not None and aside(key, live.version)):
            continue
        ref = live.doc.get("reference")
        try:
            ref_arr = np.asarray(ref, dtype=np.float64) if isinstance(ref, list) else None
            if ref_arr is not None and (ref_arr.ndim != 1 or not np.isfinite(ref_arr).all()):
                ref_arr = None
        except (TypeError, ValueError):
            ref_arr = None
        cal = live.calibrator
        served[key] = (lambda scores, kind, cal=cal: apply_or_identity(cal, scores, kind),
                       ref_arr, live.version)
        if live.doc.get("method") == "temperature":
            temps[key] = float(live.doc["params"]["temperature"])
        change = live.doc.get("change_ts")
        if isinstance(change, int | float) and math.isfinite(change):
            changes[key] = float(change)
    return LiveSet(served, temps, changes)


def regime_starts(fitted: Mapping[Key, float], alarms: Mapping[Key, float]
                  ) -> dict[Key, float]:
    """Where each series' current regime starts: the newer of the change its live
    calibrator was fitted after and the change it is alarming on now."""
    out = dict(fitted)
    for key, ts in alarms.items():
        out[key] = max(ts, out.get(key, ts))
    return out


class Engineish(Protocol):
    def set_calibrators(self, calibrators: Any) -> None: ...

    def set_changes(self, changes: Mapping[Key, float]) -> None: ...


class LiveCalibrators:
    """The last read of ``output_dir``, and the engine that is handed its calibrators
    whenever a version changed (none: the gauges only)."""

    def __init__(self, registry: Registry, engine: Engineish | None,
                 aside: Aside | None = None) -> None:
        self.registry = registry
        self.engine = engine
        self.aside = aside
        self._latest: LiveSet | None = None
        self._pushed: list[tuple[Key, int]] | None = None
        self._changes: dict[Key, float] | None = None

    def refresh(self, alarms: Mapping[Key, float] | None = None) -> None:
        """After ``output_dir`` may have changed: read it, push what changed. ``alarms``:
        the change_ts of the series alarming now; with the live calibrators' own, where
        each series' current regime starts (its estimation map fits only that)."""
        live = read_live(self.registry, self.aside)
        self._latest = live
        versions = sorted(live.versions.items())
        if self.engine is None:
            return
        if versions != self._pushed:
            self.engine.set_calibrators({k: (v[0], v[1]) for k, v in live.served.items()})
            self._pushed = versions
        changes = regime_starts(live.changes, alarms or {})
        if changes != self._changes:
            self.engine.set_changes(changes)
            self._changes = changes

    def latest(self) -> LiveSet:
        """What the last refresh read (before any: one read, nothing pushed)."""
        if self._latest is None:
            self._latest = read_live(self.registry, self.aside)
        return self._latest
