"""The worst case a config allows: series, memory and checkpoint size under its limits.

Every term is a bound the daemon enforces (``limits``, ``join.max_pending``,
``segments.max_values``, ``recalibration.buffer``) times a cost per item measured by
``bench/fleet.py`` and ``bench/engine.py`` (README, "Worst case"). The worst case
is every series with a full (dense) bucket in every window, every pending slot taken
by a ``limits.max_classes``-class prediction with the longest id: real fleets sit far
below it, and ``bench/fleet.py`` shows how far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from calmon.config import Config
from calmon.names import BUCKETS, SERIES_FAMILIES, SERIES_GAUGES  # not engine/

MiB = 2**20
GiB = 2**30
# measured costs, in bytes (bench/fleet.py, bench/engine.py, Python 3.11, numpy 2)
BASE = 200 * MiB  # the daemon and its consumer process, idle, with two polls in flight
CELL_OVERHEAD = 250  # a small held bucket beyond its int64 entries: header, dict slot
DENSE_SLACK = 4096  # a full (dense) bucket beyond its entries, allocator slack included
SERIES_OVERHEAD = 4096  # a series' bucket dicts, its index entries, its view rows
# the join's three maps, per item beyond its id, measured at their bound filled in-process
# (tests/unit/test_capacity_measured.py: 200,000 items with 256-byte ids)
PENDING = 240  # a pending binary prediction (+ 8K for a K-class one's scores)
WAITING_LABEL = 190  # a label 0/1 waiting for its prediction (engine/waiting.py columns)
# a label of 2 or more (limits.max_classes over 2) is kept whole for a dead letter: its
# object, source and model hint, beyond the record's bytes (at most LABEL_RAW_CAP)
WHOLE_LABEL = 330
LABEL_RAW_CAP = 512  # as calmon.engine.records.LABEL_RAW_CAP
REMEMBERED = 180  # a joined id remembered for duplicates
# a checkpoint write holds one copy of the state, the snapshot (the file is written from
# it, streamed): the series' arrays as written, and per join item beyond shared ids
SNAP_PENDING = 100  # + 8K for a K-class one's scores
SNAP_LABEL = 50
SNAP_WHOLE = 160  # more for a label kept whole (its bytes are shared, base64 a slice at a time)
SNAP_REMEMBERED = 80
RING_ROW = 3 * 8  # a recalibration buffer row beyond its scores: ts, label, kind
# v5: a series' estimation map: per fine bin at most its point, value, block, and the
# block's value and count (float64), beyond a fixed part
MAP_PER_FINE_BIN = 5 * 8
MAP_OVERHEAD = 512
# v5: a pending prediction's entries in its series' pending fine-bin histograms (a count
# and a confidence sum, each a sparse int64 entry with its key), per series and window
PENDING_HIST_ENTRY = 2 * 16
CGROUP_FILES = ("/sys/fs/cgroup/memory.max",  # cgroup v2
                "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v1
NO_LIMIT = 2**60  # what cgroup v1 reports when there is none


@dataclass(frozen=True)
class WorstCase:
    series_per_model: int
    models: int
    series: int  # per instance
    memory: int  # bytes
    checkpoint: int  # bytes
    parts: dict[str, int]  # memory by part
    exported: int = 0  # Prometheus series of the window families and per-bin counters


def exported_series(cfg: Config, series: int) -> int:
    """The most Prometheus series /metrics carries for ``series`` (model, segment) series,
    as ``metrics.export`` allows: per window, each kept family (the v5 band and sums
    included); per series, its gauges; per bin, the three counters where kept."""
    ex, m = cfg.metrics.export, cfg.metrics
    windows = len(ex.windows) if ex.windows is not None else len(m.windows)
    per_window = [f for f in SERIES_FAMILIES if f not in SERIES_GAUGES]
    models = min(cfg.limits.max_models, series)

    def count(families: tuple[str, ...] | None, bins: bool) -> int:
        kept = per_window if families is None else [f for f in per_window if f in families]
        gauges = SERIES_GAUGES if families is None else [
            f for f in SERIES_GAUGES if f in families]
        return len(kept) * windows + len(gauges) + (3 * m.bins if bins else 0)

    seg = ex.segment_families if ex.segment_families is not None else ex.families
    return (models * count(ex.families, ex.bins != "none")
            + (series - models) * count(seg, ex.bins == "all"))


def series_per_model(cfg: Config) -> int:
    """``__all__`` plus, per slice, every combination of its keys' values (each key
    folds past ``segments.max_values`` into ``__other__``, one more value)."""
    values = cfg.segments.max_values + 1
    return 1 + sum(int(values ** len(keys)) for keys in cfg.segments.slices)


# what one engine holds: in group mode one engine per owned partition (a task), each
# bound by the limits on its own
TASK_PARTS = ("series", "pending", "waiting labels", "joined ids", "buffers", "estimates")


def worst_case(cfg: Config, tasks: int = 1) -> WorstCase:
    """The worst case of an instance; in group mode (``kafka.instance: group``) of one
    owning ``tasks`` partitions, each task's engine as full as the limits allow (and
    every task's snapshot held at once by a checkpoint, written in one transaction)."""
    lim, m = cfg.limits, cfg.metrics
    per_model = series_per_model(cfg)
    models = lim.max_models
    # past limits.max_series a new segment folds into its model's __other__ of its slice
    series = min(models * per_model, lim.max_series + models * len(cfg.segments.slices))
    windows = len(m.windows)
    size = 3 * m.bins + 3 * m.fine_bins + 3  # a bucket's int64 entries (windows.Layout)
    cell = 8 * size
    hist = 8 * m.bins  # a score-histogram bucket, kept for two window lengths
    series_state = windows * BUCKETS * cell + windows * 2 * BUCKETS * hist
    if m.classwise:  # a pseudo-series per class, with one fine bin
        series_state += lim.max_classes * windows * BUCKETS * 8 * (3 * m.bins + 6)
    small = windows * 2 * BUCKETS + (lim.max_classes * windows * BUCKETS if m.classwise else 0)
    cells = windows * BUCKETS + small
    mem_series = series * (series_state + windows * BUCKETS * DENSE_SLACK
                           + small * CELL_OVERHEAD + SERIES_OVERHEAD)
    ckpt_series = series * (series_state + cells * 16)  # + each bucket's key
    k = lim.max_classes
    ids = lim.max_id_bytes
    slots = cfg.join.max_pending
    raw = min(LABEL_RAW_CAP, cfg.kafka.max_record_bytes) if k > 2 else 0
    whole = WHOLE_LABEL + lim.max_name_bytes + raw if k > 2 else 0
    # each map held, and copied (ids shared) into the snapshot a checkpoint is written from
    mem_pending = slots * (PENDING + SNAP_PENDING + 16 * k + ids)
    mem_labels = slots * (WAITING_LABEL + SNAP_LABEL + ids + whole
                          + (SNAP_WHOLE if k > 2 else 0))
    mem_remembered = slots * (REMEMBERED + SNAP_REMEMBERED + ids)
    ckpt_join = slots * (3 * ids + 8 * k + 64 + raw * 4 // 3)
    # v5: each series' estimation map (kept with the state), and the pending predictions
    # as fine-bin counts by decision side: bounded by the pending slots fanned out to
    # their series and windows, and by every series' buckets held dense
    maps = series * (MAP_OVERHEAD + MAP_PER_FINE_BIN * m.fine_bins)
    fan_out = 1 + len(cfg.segments.slices)
    pending_hist = min(slots * fan_out * windows * PENDING_HIST_ENTRY,
                       series * windows * BUCKETS * (4 * 8 * m.fine_bins + DENSE_SLACK))
    rc = cfg.recalibration
    rings = (series if rc.per_segment else models) if rc.enabled else 0
    mem_buffers = rings * rc.buffer * (RING_ROW + 8 * k)
    parts = {"series": mem_series, "pending": mem_pending, "waiting labels": mem_labels,
             "joined ids": mem_remembered, "buffers": mem_buffers,
             "estimates": maps + pending_hist, "base": BASE}
    n = tasks if cfg.kafka.group else 1
    for key in TASK_PARTS:
        parts[key] *= n
    inst = cfg.kafka.static
    if rc.enabled and (cfg.kafka.group or (inst is not None and inst.count > 1)):
        # scaled out, an instance may own every model's recalibration (the others
        # down): the owner's buffers of all of them, beside its own engine's
        parts["owner_buffers"] = mem_buffers
    arrays = (n * (ckpt_series + maps + pending_hist + mem_buffers)
              + parts.get("owner_buffers", 0))
    parts["checkpoint write"] = arrays  # the snapshot's copy of the arrays
    exported = series
    if cfg.kafka.group:
        # the tasks fold segments each on its own: an instance exports their union, and
        # a refresh sums every window of it into one vector each (engine/summed)
        exported = min(models * per_model, n * series)
        parts["summed windows"] = exported * windows * cell
    return WorstCase(per_model, models, series, sum(parts.values()),
                     arrays + n * ckpt_join, parts, exported_series(cfg, exported))


def cgroup_limit(files: tuple[str, ...] = CGROUP_FILES) -> int | None:
    """The container's memory limit in bytes, or None when there is none."""
    for name in files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return value if 0 < value < NO_LIMIT else None
    return None


def human(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{math.ceil(n)} B"


def report(cfg: Config, budget: int | None, partitions: int | None = None
           ) -> tuple[list[str], str | None]:
    """Lines for check-config (YAML comments) and a warning when the worst case is
    over ``budget``. In group mode, ``partitions``: the predictions topic's partition
    count when known (``--probe``), the most tasks an instance can own."""
    w = worst_case(cfg)
    lim = cfg.limits
    slices = " + ".join(f"{cfg.segments.max_values + 1}^{len(k)}" if len(k) > 1
                        else str(cfg.segments.max_values + 1) for k in cfg.segments.slices)
    lines = [
        "# worst case under these limits (README: Worst case):",
        f"#   series per model: {w.series_per_model:,} (1{' + ' + slices if slices else ''})",
        f"#   series per instance: {w.series:,} (limits.max_models {lim.max_models:,} x "
        f"{w.series_per_model:,}, at most limits.max_series {lim.max_series:,} + one "
        f"__other__ per model and slice)",
        f"#   memory: {human(w.memory)} (" + ", ".join(
            f"{k} {human(v)}" for k, v in w.parts.items()) + ")",
        f"#   checkpoint: {human(w.checkpoint)}",
        f"#   exported series: {w.exported:,} (window families, series gauges and per-bin "
        f"counters as metrics.export keeps them)",
    ]
    worst = w.memory
    if cfg.kafka.group:
        more, worst = _group_lines(cfg, budget, partitions)
        lines[2] = lines[2].replace("#   series per instance:", "#   series per task:", 1)
        lines[3] = lines[3].replace("#   memory:", "#   memory with one task:", 1)
        lines += more
    warning = None
    if budget is not None and worst > budget:
        warning = (f"warning: the worst case of this config, {human(worst)}, exceeds the "
                   f"memory budget of {human(budget)}; lower limits.max_series, "
                   f"limits.max_models, limits.max_classes or join.max_pending, or raise "
                   f"the budget")
    return lines, warning


def _group_lines(cfg: Config, budget: int | None, partitions: int | None
                 ) -> tuple[list[str], int]:
    """Group mode: the limits bind each task, so an instance's worst case grows with the
    partitions it owns, up to all of them (the other members down); the lines, and the
    worst case to hold against the budget (one task's while the count is unknown)."""
    one = worst_case(cfg, 1)
    per_task = worst_case(cfg, 2).memory - one.memory
    topic = cfg.kafka.predictions_topic
    lines = [f"#   group mode: the limits bind each task (one per owned partition of "
             f"{topic}): {human(per_task)} a task more"]
    worst = one.memory
    if partitions:
        worst = worst_case(cfg, partitions).memory
        lines.append(f"#   an instance owning all {partitions} partitions (the other "
                     f"members down): {human(worst)}")
    else:
        lines.append("#   an instance may own every partition (the other members down): "
                     "--probe counts them")
    if budget is not None:
        fit = max(0, (budget - one.memory) // per_task + 1) if one.memory <= budget else 0
        lines.append(f"#   tasks an instance can own within the budget of {human(budget)}: "
                     f"{fit:,}")
    return lines, worst
