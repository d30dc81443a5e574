"""What to fix when records are invalid: a reason code -> the config key behind it.

A wrong ``fields:`` mapping shows up as thousands of records rejected for one
reason (``missing_id``, ``no_score``, ...); the number alone does not say that
the mapping, not the data, is wrong. ``replay``, the daemon's log and
``check-config --probe`` print the same hint, so a newcomer's mistake is named
where it happens.
"""

from __future__ import annotations

from collections.abc import Mapping

from calmon.config import Config

# reason -> (field whose path is read, what the hint says)
_FIELD_OF = {
    "missing_id": "id",
    "bad_id": "id",
    "missing_model": "model",
    "bad_model": "model",
    "missing_ts": "ts",
    "bad_ts": "ts",
    "bad_segment": "segment",
    "missing_label": "label",
    "bad_label": "label",
}
_SCORES = ("prob", "logit", "probs", "logits")


def field_path(cfg: Config, topic: str, name: str) -> tuple[str, str]:
    """(config key, dotted path) the ``topic`` reads ``name`` from: the labels topic's
    own ``fields.labels.*`` where set, else ``fields.*``."""
    labels = cfg.fields.labels
    if topic == "labels" and labels is not None and getattr(labels, name, None):
        return f"fields.labels.{name}", str(getattr(labels, name))
    return f"fields.{name}", str(getattr(cfg.fields, name))


def hint(cfg: Config, topic: str, reason: str) -> str:
    """A one-line hint for ``reason`` on ``topic`` ("" when the data, not the config, is
    the likely cause)."""
    name = _FIELD_OF.get(reason)
    if name is not None:
        key, path = field_path(cfg, topic, name)
        what = "is absent from" if reason.startswith("missing") else "is unusable in"
        return f"the value at {path!r} {what} these records: check {key}"
    if reason in ("no_score", "multiple_scores"):
        paths = ", ".join(f"fields.{s}={getattr(cfg.fields, s)!r}" for s in _SCORES)
        many = "more than one" if reason == "multiple_scores" else "none"
        return f"{many} of the score paths holds a value ({paths}): map exactly one"
    if reason in ("not_json", "not_object", "not_utf8"):
        return "records must be UTF-8 JSON objects, one a line (is this CSV, gzip or binary?)"
    if reason == "label_out_of_range":
        return "labels must be class indices 0..K-1 of their prediction (0/1 for binary)"
    if reason == "probs_not_normalized":
        return "probs must sum to 1 (within 1e-3): map logits to fields.logits instead"
    return ""


def summary(cfg: Config, invalid: Mapping[tuple[str, str], int]) -> list[str]:
    """One line per (topic, reason), most frequent first, each with its hint."""
    lines = []
    for (topic, reason), n in sorted(invalid.items(), key=lambda kv: (-kv[1], kv[0])):
        h = hint(cfg, topic, reason)
        lines.append(f"{topic}: {n} invalid ({reason})" + (f": {h}" if h else ""))
    return lines
