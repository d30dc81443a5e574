"""Sample records to try calmon on, shipped with it: a click model's predictions and
labels in a schema of their own (the README's "Point it at your own topics" example),
and the config that maps it.

    python -m calmon.samples try/          # writes try/predictions.jsonl, labels.jsonl, config.yaml

``predictions.jsonl``: 2,400 predictions of ``ranker-v3`` over four hours from
2025-12-01T09:00Z (``meta.request_id``, ``served_at`` as ISO-8601, ``context`` with
country and device, ``score.p_click``), calibrated until 11:00 and over-confident
after (its log-odds doubled). ``labels.jsonl``: the clicks only, in click order,
without a time (``{"request_id": ..., "clicked": true}``; no click within 30 minutes
means 0: ``join.missing_label``). ``config.yaml``: the ``fields:`` mapping, the topics
``python -m calmon.demo.broker`` can load them into, and recalibration sized for them.
"""

from __future__ import annotations

import shutil
from importlib.resources import as_file, files
from pathlib import Path

FILES = ("predictions.jsonl", "labels.jsonl", "config.yaml")


def write(directory: str | Path) -> list[Path]:
    """Copy the sample files into ``directory`` (made if missing); their new paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FILES:
        with as_file(files(__name__).joinpath(name)) as src:
            written.append(Path(shutil.copyfile(src, out / name)))
    return written
