"""The instance shape a checkpoint was written by: its payload section ``instance``.

A state holds the windows and offsets of the partitions ``p % count == index``
owned. Restored under another shape it would count the partitions it no longer
owns alongside the instance that now owns them (or miss the ones it gained), so
a restart under another shape is refused with the way to rescale. A checkpoint
written before the shape was recorded reads as ``{index: 0, count: 1}``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from calmon.config import Instance
from calmon.files import fsync_dir

SECTION = "instance"  # the key of the checkpoint payload's state mapping
DEFAULT = {"index": 0, "count": 1}
RESCALE = ("To rescale: stop every instance, then start the new shape with `calmon run "
           "--rescale` (or move each state.dir aside first): each instance reads its "
           "partitions from the group's committed offsets, with empty windows (README, "
           '"Scaling out")')
ASIDE_PREFIX = "rescaled-"


def of_config(instance: Instance | None) -> dict[str, int]:
    """The shape this process runs as (no ``kafka.instance`` is ``{0, 1}``)."""
    if instance is None:
        return dict(DEFAULT)
    return {"index": instance.index, "count": instance.count}


def of_checkpoint(state: dict[str, Any]) -> dict[str, int]:
    """The shape recorded in a checkpoint's state. Raises ValueError when the
    section is there but is not a shape."""
    raw = state.get(SECTION)
    if raw is None:
        return dict(DEFAULT)
    if not isinstance(raw, dict) or set(raw) != {"index", "count"}:
        raise ValueError(f"{SECTION}: not {{index, count}}: {raw!r}")
    index, count = raw["index"], raw["count"]
    if (type(index) is not int or type(count) is not int or count < 1
            or not 0 <= index < count):
        raise ValueError(f"{SECTION}: not a valid shape: {raw!r}")
    return {"index": index, "count": count}


def mismatch(saved: dict[str, int], running: dict[str, int], where: str) -> str | None:
    """Why a state of shape ``saved`` cannot be used by ``running``, or None."""
    if saved == running:
        return None
    return (f"kafka.instance: the checkpoint in {where} was written by instance "
            f"{{index: {saved['index']}, count: {saved['count']}}}, this config is "
            f"{{index: {running['index']}, count: {running['count']}}}: its windows and "
            f"offsets belong to other partitions. {RESCALE}")


def move_aside(directory: Path, saved: dict[str, int], keep: tuple[str, ...]) -> Path:
    """Move everything in ``directory`` but ``keep`` (the lock) and earlier moves into
    ``directory/rescaled-<index>of<count>-<unix time>/``, whatever the checkpoint
    format's files are; returns that directory. Raises OSError."""
    aside = directory / (f"{ASIDE_PREFIX}{saved['index']}of{saved['count']}-"
                         f"{int(time.time())}")
    aside.mkdir()
    for entry in sorted(directory.iterdir()):
        if entry.name in keep or entry.name.startswith(ASIDE_PREFIX):
            continue
        os.replace(entry, aside / entry.name)
    fsync_dir(aside)
    fsync_dir(directory)
    return aside
