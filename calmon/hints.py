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
# fields both topics read: a fix of fields.<name> for one topic moves the other's path too
_SHARED = ("id", "model", "ts")


def field_path(cfg: Config, topic: str, name: str) -> tuple[str, str]:
    """(config key, dotted path) the ``topic`` reads ``name`` from: the labels topic's
    own ``fields.labels.*`` where set, else ``fields.*``."""
    labels = cfg.fields.labels
    if topic == "labels" and labels is not None and getattr(labels, name, None):
        return f"fields.labels.{name}", str(getattr(labels, name))
    return f"fields.{name}", str(getattr(cfg.fields, name))


def _fix(cfg: Config, topic: str, name: str) -> str:
    """The key that fixes ``name`` for ``topic`` alone. Where both topics read one
    ``fields.<name>``, changing it for one topic breaks the other: the labels topic is
    told to set its own ``fields.labels.<name>``, the predictions topic that its fix
    moves the labels topic's path too."""
    key, _ = field_path(cfg, topic, name)
    if name not in _SHARED or key.startswith("fields.labels."):
        return f"check {key}"
    if topic == "labels":
        return (f"the labels topic reads {key} (no fields.labels.{name} is set): set "
                f"fields.labels.{name} to the labels' own path ({key} is the predictions "
                "topic's too)")
    return (f"check {key} (the labels topic reads it too: if the labels keep the old path, "
            f"set fields.labels.{name} to it)")


def hint(cfg: Config, topic: str, reason: str) -> str:
    """A one-line hint for ``reason`` on ``topic`` ("" when the data, not the config, is
    the likely cause): the key named is the one that fixes it for that topic."""
    name = _FIELD_OF.get(reason)
    if name is not None:
        _, path = field_path(cfg, topic, name)
        what = "is absent from" if reason.startswith("missing") else "is unusable in"
        tip = f"the value at {path!r} {what} these records: {_fix(cfg, topic, name)}"
        if reason == "missing_ts":  # only where no Kafka timestamp stands in: files
            tip += " (a record without it takes its Kafka timestamp; a file has none)"
        return tip
    if reason in ("no_score", "multiple_scores"):
        paths = ", ".join(f"fields.{s}={getattr(cfg.fields, s)!r}" for s in _SCORES)
        many = "more than one" if reason == "multiple_scores" else "none"
        return f"{many} of the score paths holds a value ({paths}): map exactly one"
    if reason in ("not_json", "not_object", "not_utf8"):
        return "records must be UTF-8 JSON objects, one a line (is this CSV, gzip or binary?)"
    if reason == "label_out_of_range":
        return ("labels must be class indices 0..K-1 of their prediction (0/1 for binary), "
                "or names its model lists in models.<m>.classes")
    if reason == "bad_decision":
        return (f"the value at {cfg.fields.decision!r} (fields.decision) must be a class of "
                "its prediction: 0/1 or true/false for binary, an index 0..K-1, or a name "
                "listed in models.<m>.classes")
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
