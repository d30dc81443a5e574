"""Raw Kafka-or-file records -> validated predictions and labels, or a reason.

``Parser.parse`` never raises: every way a record can break the contract maps
to one stable reason code (the ``reason`` label of
``calmon_invalid_records_total``), listed in ``REASONS``.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np

# orjson decodes ~3x faster than the stdlib, and decoding is most of parsing
from orjson import loads as _fast_loads

from calmon.config import FieldsConfig, LimitsConfig
from calmon.engine.decisions import BAD, NONE, ClassNames, decision_of
from calmon.names import BINARY_KINDS as BINARY_KINDS  # re-exported: older imports
from calmon.names import SCORE_KINDS as SCORE_KINDS
from calmon.names import ScoreKind as ScoreKind


class Kind(enum.Enum):
    PREDICTION = "prediction"
    LABEL = "label"


_PREDICTION = Kind.PREDICTION  # a module constant: one lookup less per record


class Unkeyed(enum.Enum):
    """The key of a record that did not come from Kafka (a file): nothing to compare,
    unlike a Kafka record with a null key."""

    UNKEYED = "unkeyed"


UNKEYED = Unkeyed.UNKEYED


class Raw(NamedTuple):
    """One record as it came off a topic or out of a file, not yet decoded. A named
    tuple: the cheapest record there is to build, once per consumed record."""

    kind: Kind
    value: bytes | None
    timestamp: float | None = None  # broker timestamp in seconds, if any
    source: str = ""  # "topic/partition/offset" or "file:line", for dead letters
    key: bytes | Unkeyed | None = UNKEYED  # the Kafka record key (None: a null key)


# Stable reason codes, each a contract rule a record can break.
REASONS = (
    "oversize",  # value longer than kafka.max_record_bytes
    "empty",  # null or zero-length value (e.g. a tombstone)
    "not_utf8",
    "not_json",
    "not_object",  # valid JSON, but not an object
    "missing_id",
    "bad_id",  # id neither a string nor an integer, empty, or over limits.max_id_bytes
    "missing_model",
    "bad_model",  # not a string, empty, control characters, or over limits.max_name_bytes
    "too_many_models",  # a new model name past limits.max_models
    "missing_ts",  # no ts field and no broker timestamp
    "bad_ts",  # unreadable, out of years 1..9999, or past the Kafka time + max_clock_skew
    "no_score",
    "multiple_scores",
    "bad_score",  # wrong type or shape (probs with fewer than 2 classes, ...)
    "too_many_classes",  # K over limits.max_classes
    "not_finite",  # NaN or infinity in a score
    "prob_out_of_range",
    "probs_not_normalized",
    "bad_segment",
    "missing_label",
    "bad_label",  # neither an integer class index, a boolean nor a class name (a string)
    # checked against the prediction's classes (or, for a name, its model's
    # models.<m>.classes) when they meet
    "label_out_of_range",
    "bad_decision",  # v5: a decision that is no class of the prediction (contract §1)
    "classes_mismatch",  # K differs from the class count of the model's live series
    "internal",  # processing the record raised: a calmon bug, isolated to this record
    # a record batch whose records cannot be read, counted once (the source skips it):
    "bad_batch",  # corrupt, CRC mismatch, unknown codec, or a message error of librdkafka
    "batch_oversize",  # inflates past the bound on a batch (a decompression bomb)
)

# the kinds below MULTICLASS (ScoreKind.PROBS) are binary (scored on P(y=1))
MULTICLASS = int(ScoreKind.PROBS)  # a plain int: compared once per record on the hot path
PROBS_TOLERANCE = 1e-3
LABEL_RAW_CAP = 512  # bytes of a label record kept while it waits for its prediction
# event times calmon accepts: what datetime can represent (years 1..9999), so window
# buckets never overflow and ts + ttl stays distinct from ts
TS_MIN, TS_MAX = -62135596800.0, 253402300799.0


@dataclass(slots=True)
class Prediction:
    id: str
    model: str
    ts: float
    segment: dict[str, str]
    kind: str  # one of SCORE_KINDS
    score: Any  # as given: float for prob/logit, a float64 numpy row for probs/logits
    source: str = ""
    decision: int = NONE  # v5: the model's own decision, a class index (NONE: not given)

    @property
    def classes(self) -> int:
        """0 for a binary model, K for a K-class one: what "classes" means everywhere
        in calmon (a 2-class ``probs`` model is top-label scored, a binary one is not)."""
        return 0 if self.kind in BINARY_KINDS else len(self.score)


@dataclass(slots=True)
class Label:
    id: str
    label: int | str  # a class index, or (v5) a class name resolved when it meets
    ts: float | None
    model: str | None
    raw: bytes | None = None  # kept so a label found out of range later can be dead-lettered

    def dead_letter_value(self) -> bytes:
        """The record as received, or, when it was too large to keep, its essentials."""
        if self.raw is not None:
            return self.raw
        return json.dumps({"id": self.id, "label": self.label, "ts": self.ts}).encode()
    source: str = ""


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str


class _Invalid(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


_MISSING = object()

# characters a name may not hold: C0/C1 controls and the Unicode line and paragraph
# separators, so no name can forge a log line or break a label or a page
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


_GOOD_NAMES_CAP = 1024


def _exact_id(value: bytes, path: str | tuple[str, ...]) -> Any:
    """The id of a record whose fast decoder read it as a float, read again exactly: an
    integer (the stdlib reads every digit), or what makes it a bad one."""
    try:
        return _dig(json.loads(value), path)
    except (ValueError, RecursionError):  # over 4,300 digits, among others
        return None


def _name_ok(v: str, max_bytes: int) -> bool:
    """A model name or segment value calmon can store, export and log safely. Lone
    surrogates never get here: decoding rejects them as not_utf8."""
    if len(v) > max_bytes or (len(v) * 4 > max_bytes and len(v.encode("utf-8")) > max_bytes):
        return False
    return _CONTROL.search(v) is None


def _has_surrogate(obj: Any) -> bool:
    """Whether any string in decoded JSON (keys included) holds a lone surrogate, which
    the stdlib decoder lets through from a ``\\udXXX`` escape. Iterative: no recursion."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def _path(path: str) -> str | tuple[str, ...]:
    """A plain key stays a string (read with one ``dict.get``); a dotted path splits."""
    return path if "." not in path else tuple(path.split("."))


def _dig(obj: dict[str, Any], parts: str | tuple[str, ...]) -> Any:
    if type(parts) is str:
        return obj.get(parts, _MISSING)
    for p in parts:
        if not isinstance(obj, dict) or p not in obj:
            return _MISSING
        obj = obj[p]
    return obj


def parse_ts(v: Any) -> float:
    """Epoch seconds or an ISO-8601 string (naive means UTC). Raises _Invalid."""
    if type(v) is float and TS_MIN <= v <= TS_MAX:  # the common case, checked first
        return v
    if isinstance(v, bool):
        raise _Invalid("bad_ts")
    if isinstance(v, int | float):
        try:
            f = float(v)  # an integer too large for a float overflows
        except OverflowError:
            raise _Invalid("bad_ts") from None
        if not TS_MIN <= f <= TS_MAX:  # also rejects NaN and infinities
            raise _Invalid("bad_ts")
        return f
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip())
        except ValueError:
            raise _Invalid("bad_ts") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    raise _Invalid("bad_ts")


def _number(v: Any) -> float:
    if type(v) is float:  # the common case, checked first
        if v - v != 0.0:  # NaN or infinity
            raise _Invalid("not_finite")
        return v
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Invalid("bad_score")
    try:
        f = float(v)
    except OverflowError:  # an integer too large for a float
        raise _Invalid("not_finite") from None
    if not math.isfinite(f):
        raise _Invalid("not_finite")
    return f


def _stringify(seg: dict[str, Any], max_bytes: int) -> dict[str, str]:
    """Segment values as strings: null dropped, booleans as true/false, numbers as
    written by ``str``; anything else, or a value that is no safe name, is
    ``bad_segment``."""
    out: dict[str, str] = {}
    for k, sv in seg.items():
        if sv is None:
            continue
        if isinstance(sv, str):
            out[k] = sv
        elif isinstance(sv, bool):
            out[k] = "true" if sv else "false"
        elif isinstance(sv, int | float):
            out[k] = str(sv)
        else:
            raise _Invalid("bad_segment")
        if not _name_ok(out[k], max_bytes):
            raise _Invalid("bad_segment")
    return out


def _vector(v: Any, max_classes: int) -> np.ndarray:
    """A list of K finite numbers as a float64 row; K is checked before any element
    is read, so a huge list costs nothing."""
    if not isinstance(v, list) or len(v) < 2:
        raise _Invalid("bad_score")
    if len(v) > max_classes:
        raise _Invalid("too_many_classes")
    for x in v:
        if type(x) is not float and (isinstance(x, bool) or not isinstance(x, int | float)):
            raise _Invalid("bad_score")
    try:
        row = np.array(v, dtype=np.float64)
    except OverflowError:  # an integer too large for a float
        raise _Invalid("not_finite") from None
    if not np.isfinite(row).all():
        raise _Invalid("not_finite")
    return row


class Parser:
    """Decodes and validates records against the contract, field paths from config."""

    def __init__(self, fields: FieldsConfig, max_record_bytes: int,
                 limits: LimitsConfig | None = None, max_clock_skew: float | None = None,
                 names: ClassNames | None = None) -> None:
        self.max_bytes = max_record_bytes
        self.names = names if names is not None else ClassNames()  # models.<m>.classes
        self._decision = None if fields.decision is None else _path(fields.decision)
        limits = limits if limits is not None else LimitsConfig()
        self.max_id_bytes = limits.max_id_bytes
        self.max_name_bytes = limits.max_name_bytes
        self.max_classes = limits.max_classes
        self.max_clock_skew = math.inf if max_clock_skew is None else max_clock_skew
        self._good_names: set[Any] = set()  # model names already found safe
        # live only: wall clock + max_clock_skew, set per batch by the daemon, since a
        # producer sets the Kafka CreateTime too; a replay of files has no such ceiling
        self.not_after = math.inf
        self._id = _path(fields.id)
        self._model = _path(fields.model)
        self._ts = _path(fields.ts)
        self._segment = _path(fields.segment)
        lf = fields.for_labels()  # the labels topic's own paths (fields.labels)
        self._lid, self._lts, self._lmodel = _path(lf.id), _path(lf.ts), _path(lf.model)
        self._label = _path(lf.label)
        self._scores = tuple((k, _path(getattr(fields, k))) for k in SCORE_KINDS)
        plain = all(type(p) is str for _, p in self._scores)
        self._score_kind: dict[str, str] = (
            {p: k for k, p in self._scores if type(p) is str} if plain else {})
        self._score_keys = frozenset(self._score_kind) if plain else None

    def parse(self, raw: Raw) -> Prediction | Label | Reject:
        try:
            obj = self._decode(raw.value)
            if raw.kind is _PREDICTION:
                return self._prediction(obj, raw)
            return self._label_record(obj, raw)
        except _Invalid as e:
            return Reject(e.reason)
        except RecursionError:  # absurdly nested JSON
            return Reject("not_json")

    def _decode(self, value: bytes | None) -> dict[str, Any]:
        if not value:
            raise _Invalid("empty")
        if len(value) > self.max_bytes:
            raise _Invalid("oversize")
        try:
            obj = _fast_loads(value)
        except ValueError:  # the stdlib decoder tells which rule broke (NaN is JSON to it)
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                raise _Invalid("not_utf8") from None
            try:
                obj = json.loads(text)
            except ValueError:
                raise _Invalid("not_json") from None
            if "\\" in text and _has_surrogate(obj):  # orjson refuses those; json does not
                raise _Invalid("not_utf8") from None
        if not isinstance(obj, dict):
            raise _Invalid("not_object")
        return obj

    def _common_id(self, obj: dict[str, Any], value: bytes | None, path: Any = None) -> str:
        path = self._id if path is None else path
        v = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        if type(v) is str and v and len(v) <= self.max_id_bytes // 4:  # the common case
            return v
        if v is _MISSING or v is None:
            raise _Invalid("missing_id")
        if type(v) is float and value:  # orjson reads integers past 64 bits as floats
            v = _exact_id(value, path)
        if isinstance(v, int) and not isinstance(v, bool):
            # an integer id is its decimal string (contract §1), of up to max_id_bytes digits
            s = str(v)  # at most 4,300 digits: Python refuses to read longer ones
            if len(s) <= self.max_id_bytes:
                return s
            raise _Invalid("bad_id")
        if (isinstance(v, str) and v and len(v) <= self.max_id_bytes
                and len(v.encode("utf-8")) <= self.max_id_bytes):
            return v
        raise _Invalid("bad_id")

    def _time(self, obj: dict[str, Any], raw: Raw, required: bool,
              path: Any = None) -> float | None:
        path = self._ts if path is None else path
        v = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        if v is _MISSING or v is None:
            if raw.timestamp is not None:
                if raw.timestamp > self.not_after:
                    raise _Invalid("bad_ts")  # a producer-set Kafka time from the future
                return raw.timestamp
            if required:
                raise _Invalid("missing_ts")
            return None
        ts = parse_ts(v)
        # from the future: it would move event-time "now" and expire everything else
        if raw.timestamp is not None and ts > raw.timestamp + self.max_clock_skew:
            raise _Invalid("bad_ts")
        if ts > self.not_after:
            raise _Invalid("bad_ts")
        return ts

    def _prediction(self, obj: dict[str, Any], raw: Raw) -> Prediction:
        pid = self._common_id(obj, raw.value)
        path = self._model
        model = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        if model is _MISSING or model is None:
            raise _Invalid("missing_model")
        if type(model) is not str or model not in self._good_names:  # a handful is the norm
            if not isinstance(model, str) or not model or not _name_ok(model,
                                                                        self.max_name_bytes):
                raise _Invalid("bad_model")
            if len(self._good_names) < _GOOD_NAMES_CAP:
                self._good_names.add(model)
        if self._score_keys is not None:  # plain keys: one set intersection finds them
            found = [(self._score_kind[k], obj[k]) for k in self._score_keys & obj.keys()
                     if obj[k] is not None]
        else:
            found = [(k, v) for k, path in self._scores
                     if (v := (obj.get(path, _MISSING) if type(path) is str
                               else _dig(obj, path))) is not _MISSING and v is not None]
        if not found:
            raise _Invalid("no_score")
        if len(found) > 1:
            raise _Invalid("multiple_scores")
        kind, v = found[0]
        score: Any
        if kind == "prob":
            score = _number(v)
            if not 0.0 <= score <= 1.0:
                raise _Invalid("prob_out_of_range")
        elif kind == "logit":
            score = _number(v)
        elif kind == "probs":
            score = _vector(v, self.max_classes)
            if score.min() < 0.0:
                raise _Invalid("prob_out_of_range")
            try:
                total = math.fsum(score.tolist())
            except OverflowError:  # e.g. [1e308, 1e308]
                raise _Invalid("probs_not_normalized") from None
            if abs(total - 1.0) > PROBS_TOLERANCE:
                raise _Invalid("probs_not_normalized")
        else:
            score = _vector(v, self.max_classes)
        ts = self._time(obj, raw, required=True)
        assert ts is not None  # required: _time raised otherwise
        path = self._segment
        seg = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        segment: dict[str, str] = {}
        if seg is not _MISSING and seg is not None:
            if type(seg) is not dict:
                raise _Invalid("bad_segment")
            segment = seg  # freshly decoded and ours: kept as is when all values are plain
            limit = self.max_name_bytes // 4  # a string this short is within the byte limit
            for sv in seg.values():
                if type(sv) is not str or len(sv) > limit or _CONTROL.search(sv) is not None:
                    segment = _stringify(seg, self.max_name_bytes)
                    break
        decision = NONE
        if self._decision is not None:
            path = self._decision
            v = obj.get(path) if type(path) is str else _dig(obj, path)
            decision = decision_of(None if v is _MISSING else v,
                                   0 if kind in BINARY_KINDS else len(score),
                                   self.names.names(model))
            if decision == BAD:
                raise _Invalid("bad_decision")
        return Prediction(pid, model, ts, segment, kind, score, raw.source, decision)

    def _label_record(self, obj: dict[str, Any], raw: Raw) -> Label:
        lid = self._common_id(obj, raw.value, self._lid)
        path = self._label
        v = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        if v is _MISSING or v is None:
            raise _Invalid("missing_label")
        label: int | str
        if type(v) is str:  # v5: a class name; one no model can list is out of range now
            if not v or not _name_ok(v, self.max_name_bytes):
                raise _Invalid("label_out_of_range")
            label = v
        elif isinstance(v, bool):
            label = int(v)
        elif isinstance(v, int):
            label = v
        elif isinstance(v, float) and v.is_integer():
            label = int(v)
        else:
            raise _Invalid("bad_label")
        if type(label) is int and not 0 <= label < self.max_classes:  # out of range for all
            raise _Invalid("label_out_of_range")
        path = self._lmodel
        model = obj.get(path, _MISSING) if type(path) is str else _dig(obj, path)
        # a hint only (a label never creates a model), and kept only when it is a safe name
        model = model if isinstance(model, str) and model and _name_ok(
            model, self.max_name_bytes) else None
        ts = self._time(obj, raw, required=False, path=self._lts)
        # a waiting label keeps its bytes for a later dead letter, unless they are large:
        # up to join.max_pending labels wait, and their memory must stay small
        kept = raw.value if raw.value is not None and len(raw.value) <= LABEL_RAW_CAP else None
        return Label(lid, label, ts, model, kept, raw.source)
