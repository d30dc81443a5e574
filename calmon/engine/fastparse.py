"""A batch of raw records -> ``Parsed`` columns, exactly what ``Parser`` gives, faster.

The fast path decodes each record with msgspec into a typed Struct that admits only
the common, clearly valid shape (types, ranges and lengths are checked in C), then
checks the rest over whole columns: names and segments against bounded caches of
spellings already found valid, timestamps and multiclass rows with numpy. Any record
msgspec refuses, and any record a column check flags, goes to the slow path,
``Parser.parse`` of that one record, so reasons are Parser's by construction.

Each record is decoded alone: values joined into one JSON array could decode
differently from each record on its own (a crafted value can close the array).
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta
from orjson import loads as _orjson_loads

from calmon.config import FieldsConfig, LimitsConfig
from calmon.engine.decisions import BAD, NAMED, NONE, ClassNames, decision_of
from calmon.engine.msgstructs import Leaf as _Leaf
from calmon.engine.msgstructs import build_struct as _build_struct
from calmon.engine.msgstructs import columns as _columns
from calmon.engine.parsed import LABEL, PRED, REJECT, Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import (
    _CONTROL,
    _GOOD_NAMES_CAP,
    LABEL_RAW_CAP,
    MULTICLASS,
    PROBS_TOLERANCE,
    SCORE_KINDS,
    TS_MAX,
    TS_MIN,
    Kind,
    Label,
    Parser,
    Prediction,
    Raw,
    Reject,
    _Invalid,
    _name_ok,
    _stringify,
)

_PREDICTION = Kind.PREDICTION
_LABEL = Kind.LABEL

# |x| bound for logits and ints read as floats: below 2**53 every JSON integer is
# exactly a float, so msgspec's int -> float and Parser's float(int) cannot differ
_BIG = 1e15
# a multiclass row whose numpy sum is this close to the tolerance edge goes to the slow
# path: numpy's pairwise sum and Parser's math.fsum differ by < K * 2**-52, far less
_SUM_MARGIN = 1e-9
# records this long may nest deeply: orjson refuses depth > 1024, msgspec's limit
# follows the recursion limit; with this many brackets the slow path decides
_LONG = 2000
_MAX_BRACKETS = 900
_SEG_CACHE_CAP = 4096  # segment spellings kept (cleared when full)
_SEG_CACHE_BYTES = 1024  # longer segment spellings are validated each time, never kept
_NO_SEGMENT = msgspec.Raw(b"")
_SEGMENTS_ALWAYS: dict[bytes, dict[str, str]] = {b"": {}, b"null": {}}  # absent, null
_SCORE_BIT = {1: 0, 2: 1, 4: 2, 8: 3}  # one score field present -> its ScoreKind


class BatchParser:
    """``Parser`` over a whole batch: ``parse(raws).same(Parsed.from_records(
    [Parser(...).parse(r) for r in raws]))`` for every input and setting."""

    def __init__(self, fields: FieldsConfig, max_record_bytes: int,
                 limits: LimitsConfig | None = None, max_clock_skew: float | None = None,
                 names: ClassNames | None = None) -> None:
        # the slow path
        self.parser = Parser(fields, max_record_bytes, limits, max_clock_skew, names)
        self.names = self.parser.names
        limits = limits if limits is not None else LimitsConfig()
        self.max_bytes = max_record_bytes
        self.max_id_bytes = limits.max_id_bytes
        self.max_name_bytes = limits.max_name_bytes
        self.max_clock_skew = math.inf if max_clock_skew is None else max_clock_skew
        # live only: wall clock + max_clock_skew, set per batch by the caller (Parser.not_after)
        self.not_after = math.inf
        self.slow_calls = 0  # records handed to Parser.parse, for tests and profiling
        self._names: set[str] = set()  # model names already found safe (bounded)
        self._segments: dict[bytes, dict[str, str]] = dict(_SEGMENTS_ALWAYS)  # spelling -> segment

        max_id, max_name, max_k = limits.max_id_bytes, limits.max_name_bytes, limits.max_classes
        # an integer id of any length msgspec reads (4,300 digits); _ids checks its digits
        id_t = Annotated[str, Meta(min_length=1, max_length=max_id)] | int
        name_t = Annotated[str, Meta(min_length=1, max_length=max_name)]
        ts_t = Annotated[float, Meta(ge=TS_MIN, le=TS_MAX)] | None
        finite = Annotated[float, Meta(ge=-_BIG, le=_BIG)]
        score_t: dict[str, Any] = {
            "prob": Annotated[float, Meta(ge=0.0, le=1.0)] | None,
            "logit": finite | None,
            # an element over 1 + 2 * tolerance fails the sum anyway
            "probs": Annotated[list[Annotated[float, Meta(ge=0.0, le=1.0 + 2 * PROBS_TOLERANCE)]],
                               Meta(min_length=2, max_length=max_k)] | None,
            "logits": Annotated[list[finite], Meta(min_length=2, max_length=max_k)] | None,
        }
        pred: dict[str, tuple[str, _Leaf]] = {
            "id": (fields.id, _Leaf("id", id_t, True)),
            "model": (fields.model, _Leaf("model", name_t, True)),
            "ts": (fields.ts, _Leaf("ts", ts_t, False)),
            "segment": (fields.segment, _Leaf("segment", msgspec.Raw, False, _NO_SEGMENT)),
        }
        for k in SCORE_KINDS:
            pred[k] = (getattr(fields, k), _Leaf(k, score_t[k], False))
        # a short name or an index; the rest (floats, long names) Parser reads
        short = Annotated[str, Meta(min_length=1, max_length=max_name // 4)]
        if fields.decision is not None:
            pred["decision"] = (fields.decision, _Leaf(
                "decision", Annotated[int, Meta(ge=0, le=max_k - 1)] | bool | short | None,
                False))
        lf = fields.for_labels()  # the labels topic's own paths (fields.labels)
        label: dict[str, tuple[str, _Leaf]] = {
            "id": (lf.id, _Leaf("id", id_t, True)),
            "label": (lf.label, _Leaf("label", Annotated[int, Meta(ge=0, le=max_k - 1)] | bool
                                      | short, True)),
            "model": (lf.model, _Leaf("model", str | None, False)),
            "ts": (lf.ts, _Leaf("ts", ts_t, False)),
        }
        self._pstruct = _build_struct("FastPrediction", pred)
        self._lstruct = _build_struct("FastLabel", label)
        self._pdec: Callable[[bytes], Any] | None = None
        self._ldec: Callable[[bytes], Any] | None = None
        if self._pstruct is not None:
            self._pdec = msgspec.json.Decoder(self._pstruct).decode
        if self._lstruct is not None:
            self._ldec = msgspec.json.Decoder(self._lstruct).decode
        self._pcols = {k: self._chain(self._pstruct, p) for k, (p, _) in pred.items()}
        self._lcols = {k: self._chain(self._lstruct, p) for k, (p, _) in label.items()}

    @staticmethod
    def _chain(st: type[msgspec.Struct] | None, path: str) -> tuple[str, ...]:
        """The Struct attribute names leading to ``path``."""
        names: list[str] = []
        for part in (path.split(".") if "." in path else [path]):
            if st is None:
                return ()
            info = next(f for f in msgspec.structs.fields(st) if f.encode_name == part)
            names.append(info.name)
            st = next((a for a in getattr(info.type, "__args__", (info.type,))
                       if isinstance(a, type) and issubclass(a, msgspec.Struct)), None)
        return tuple(names)

    # ------------------------------------------------------------------ the batch

    def parse(self, raws: list[Raw] | RawBatch) -> Parsed:
        if not raws:
            return Parsed()
        self.parser.not_after = self.not_after
        # A batch holds thousands of young containers at once (K-class lists, column
        # lists) that all live until it ends: a collection mid-batch would traverse them
        # only to promote them (-25% time for 10-class batches). Deferred, not skipped: the
        # next allocation after parse triggers it as usual.
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._parse(raws)
        finally:
            if paused:
                gc.enable()

    def _parse(self, raws: list[Raw] | RawBatch) -> Parsed:
        n = len(raws)
        kinds: Sequence[Kind]
        values: Sequence[bytes | None]
        stamps: Sequence[float | None]
        sources: Sequence[str] | None
        if isinstance(raws, RawBatch):  # a label's source is made when it is needed
            kinds, values, stamps, sources = raws.kinds, raws.values, raws.stamps, None
        else:
            kinds, values, stamps, sources, _keys = zip(*raws)
        pre = self._guards(values)
        # Parser reads any kind but PREDICTION as a label; enums compare by identity
        # (an enum's hash is Python code)
        lidx: list[int]
        if isinstance(raws, RawBatch):  # a part per partition: index ranges, no scan
            pidx, lidx = raws.indices(_PREDICTION), raws.indices(Kind.LABEL)
        else:
            pidx = [i for i, k in enumerate(kinds) if k is _PREDICTION]
            if len(pidx) == n:
                lidx = []
            elif not pidx:
                lidx = list(range(n))
            else:
                lidx = [i for i, k in enumerate(kinds) if k is not _PREDICTION]
        pidx, precs, slow = self._decode(self._pdec, pidx, values, pre)
        lidx, lrecs, lslow = self._decode(self._ldec, lidx, values, pre)
        pcols, pslow = self._predictions(pidx, precs, stamps)
        lcols, lslow2 = self._labels(lidx, lrecs, values, stamps, sources)
        slow += lslow + pslow + lslow2
        slow.sort()
        out = self._assemble(kinds, raws, slow, pidx, pcols, lidx, lcols)
        if sources is None:
            out.source_of = raws.source  # type: ignore[union-attr]
        return out

    def _guards(self, values: Sequence[bytes | None]) -> set[int]:
        """Records the slow path must decide whatever msgspec says: null values, invalid
        UTF-8 (msgspec does not check it in fields it skips), oversize, deep nesting."""
        pre: set[int] = set()
        try:
            joined = b"\n".join(values)  # type: ignore[arg-type]  # None raises TypeError
        except TypeError:  # a None value (a tombstone): the slow path says empty
            pre = {i for i, v in enumerate(values) if v is None}
            joined = b"\n".join(v for v in values if v is not None)
        # an ASCII separator cannot complete a truncated sequence, so the join decodes iff
        # every value does
        if not joined.isascii():
            try:
                joined.decode("utf-8")
            except UnicodeDecodeError:
                for i, v in enumerate(values):
                    if v is not None and not v.isascii():
                        try:
                            v.decode("utf-8")
                        except UnicodeDecodeError:
                            pre.add(i)
        if not pre:
            longest = max(map(len, values))  # type: ignore[arg-type]
        else:
            longest = max((len(v) for v in values if v is not None), default=0)
        if longest > self.max_bytes or longest >= _LONG:
            for i, v in enumerate(values):
                if v is not None and (len(v) > self.max_bytes or (
                        len(v) >= _LONG and v.count(b"[") + v.count(b"{") > _MAX_BRACKETS)):
                    pre.add(i)
        return pre

    @staticmethod
    def _decode(dec: Callable[[bytes], Any] | None, idx: list[int],
                values: Sequence[bytes | None], pre: set[int]
                ) -> tuple[list[int], list[Any], list[int]]:
        """(batch indices decoded, their Structs, batch indices for the slow path)."""
        if not idx:
            return idx, [], []
        if dec is None:  # clashing field paths: every record of this kind goes slow
            return [], [], list(idx)
        vals = values if len(idx) == len(values) else [values[i] for i in idx]
        if not pre:
            try:  # the common case: one C loop, no per-record try
                return idx, list(map(dec, vals)), []  # type: ignore[arg-type]
            except Exception:  # any refusal: decided record by record below
                pass
        keep: list[int] = []
        recs: list[Any] = []
        slow: list[int] = []
        for i, v in zip(idx, vals):
            if i in pre or v is None:
                slow.append(i)
                continue
            try:
                recs.append(dec(v))
            except Exception:  # decode errors, recursion: Parser decides
                slow.append(i)
                continue
            keep.append(i)
        return keep, recs, slow

    # ------------------------------------------------------------------ columns

    def _ids(self, raw: Sequence[str | int], slow: set[int]) -> list[str]:
        ids: list[str]
        try:
            "".join(raw)  # type: ignore[arg-type]  # raises unless every id is a str
            ids = list(raw)  # type: ignore[arg-type]
        except TypeError:
            ids = list(map(str, raw))  # ints as Parser writes them
        lim = self.max_id_bytes // 4  # this many code points fit in the byte limit
        if ids and max(map(len, ids)) > lim:
            slow.update(j for j, (s, o) in enumerate(zip(ids, raw))
                        if len(s) > lim and (len(s) > self.max_id_bytes if type(o) is int
                                             else len(s.encode("utf-8")) > self.max_id_bytes))
        return ids

    def _name(self, v: str) -> bool:
        """A safe, non-empty model name (cached: a handful is the norm)."""
        if v in self._names:
            return True
        if not v or not _name_ok(v, self.max_name_bytes):
            return False
        if len(self._names) < _GOOD_NAMES_CAP:
            self._names.add(v)
        return True

    def _times(self, ts: Sequence[float | None], stamps: Sequence[float | None],
               required: bool, slow: set[int]) -> list[float | None]:
        """Parser._time over a column: the Kafka time stands in for a missing ts, and a ts
        past the Kafka time + max_clock_skew, or past not_after, is the slow path's."""
        na, skew, n = self.not_after, self.max_clock_skew, len(ts)
        missing, unstamped = ts.count(None), stamps.count(None)
        try:
            if unstamped == 0:
                r = np.array(stamps, np.float64)
                t = np.array(ts, np.float64)  # None -> NaN; a decoded ts is never NaN
                late = (t > r + skew) | (t > na) | np.isnan(r)
                if missing:
                    late = np.where(np.isnan(t), r > na, late) | np.isnan(r)
                    ts = [s if s is not None else st for s, st in zip(ts, stamps)]
                slow.update(np.flatnonzero(late).tolist())
                return list(ts)
            if unstamped == n:
                if missing and required:
                    slow.update(j for j, s in enumerate(ts) if s is None)
                t = np.array(ts, np.float64)
                slow.update(np.flatnonzero(t > na).tolist())
                return list(ts)
        except (TypeError, ValueError, OverflowError):  # odd Kafka times: record by record
            pass
        out: list[float | None] = []
        for j, (s, st) in enumerate(zip(ts, stamps)):
            if s is None:
                if st is None:
                    if required:
                        slow.add(j)
                elif st > na:
                    slow.add(j)
                out.append(st)
            else:
                if (st is not None and s > st + skew) or s > na:
                    slow.add(j)
                out.append(s)
        return out

    def _segment(self, b: bytes) -> dict[str, str] | None:
        """The segment a spelling stands for, as Parser builds it, or None to go slow.
        Values other than strings, null, booleans and 64-bit integers go slow, since
        the stdlib decoder (Parser's fallback) may read those differently from orjson."""
        try:
            seg = _orjson_loads(b)
        except ValueError:
            return None
        if seg is None:
            return {}
        if type(seg) is not dict:
            return None
        limit = self.max_name_bytes // 4
        plain = True
        for sv in seg.values():
            t = type(sv)
            if t is str:
                if len(sv) > limit or _CONTROL.search(sv) is not None:
                    plain = False
            elif sv is None or t is bool or (t is int and -(2**63) <= sv < 2**63):
                plain = False
            else:
                return None
        if plain:
            return seg
        try:
            return _stringify(seg, self.max_name_bytes)
        except _Invalid:
            return None

    def _segments_of(self, raw: Sequence[Any], slow: set[int]
                     ) -> tuple[list[dict[str, str]], list[bytes]]:
        """Segments and their keys (the JSON spelling: equal bytes, equal segment)."""
        try:
            keys = list(map(bytes, raw))
        except TypeError:  # an absent nested object on the way
            keys = [bytes(x) if x is not None else b"" for x in raw]
        cache = self._segments
        try:
            return list(map(cache.__getitem__, keys)), keys
        except KeyError:
            pass
        segs: list[dict[str, str]] = []
        for j, key in enumerate(keys):
            seg = cache.get(key)
            if seg is None:
                seg = self._segment(key)
                if seg is None:
                    slow.add(j)
                    seg = {}  # a placeholder: the row goes slow
                elif len(key) <= _SEG_CACHE_BYTES:
                    if len(cache) >= _SEG_CACHE_CAP:
                        cache.clear()
                        cache.update(_SEGMENTS_ALWAYS)
                    cache[key] = seg
            segs.append(seg)
        return segs, keys

    def _predictions(self, idx: list[int], recs: list[Any], stamps: Sequence[float | None]
                     ) -> tuple[list[list[Any]], list[int]]:
        """Columns id, model, ts, segment, segkey, kind, classes, score, vec (a K-class row
        or None) of the decoded predictions, and the batch indices that go slow."""
        if not idx:
            return [[] for _ in range(10)], []
        n = len(recs)
        cols = _columns(recs, self._pcols)
        slow: set[int] = set()
        ids = self._ids(cols["id"], slow)
        models = cols["model"]
        if not self._names.issuperset(models):
            slow.update(j for j, m in enumerate(models) if not self._name(m))
        scores = [cols[k] for k in SCORE_KINDS]
        classes = [0] * n
        present = [n - c.count(None) for c in scores]
        vec_rows: list[int]
        if present.count(0) == 3 and n in present:  # one score kind throughout
            code = present.index(n)
            kind = [code] * n
            if code < MULTICLASS:
                score = list(scores[code])
                vec_rows = []
            else:
                score = [0.0] * n
                vec_rows = list(range(n))
        else:
            bits = [(a is not None) | (b is not None) << 1 | (c is not None) << 2
                    | (d is not None) << 3 for a, b, c, d in zip(*scores)]
            kind = [_SCORE_BIT.get(x, -1) for x in bits]
            slow.update(j for j, k in enumerate(kind) if k < 0)
            score = [a if a is not None else (b if b is not None else 0.0)
                     for a, b in zip(scores[0], scores[1])]
            vec_rows = [j for j, k in enumerate(kind) if k >= MULTICLASS]
        vec: list[np.ndarray | None] = [None] * n
        if vec_rows:
            self._vectors(vec_rows, kind, scores, vec, classes, slow)
        pstamps = stamps if n == len(stamps) else [stamps[i] for i in idx]
        ts = self._times(cols["ts"], pstamps, True, slow)
        segs, keys = self._segments_of(cols["segment"], slow)
        decisions = self._decisions(cols.get("decision"), models, kind, classes, slow)
        out = [ids, list(models), ts, segs, keys, kind, classes, score, vec, decisions]
        return out, [idx[j] for j in slow]

    def _decisions(self, raw: Sequence[Any] | None, models: Sequence[str], kind: list[int],
                   classes: list[int], slow: set[int]) -> list[int]:
        """v5: each prediction's decision (``decisions.decision_of``); one that is not
        clearly valid goes slow, where Parser says why."""
        n = len(kind)
        if raw is None or raw.count(None) == n:
            return [NONE] * n
        names = self.names.names
        out = [decision_of(v, c, names(m)) for v, c, m in zip(raw, classes, models)]
        slow.update(j for j, d in enumerate(out) if d == BAD)
        return out

    def _vectors(self, rows: list[int], kind: list[int], scores: list[Sequence[Any]],
                 vec: list[np.ndarray | None], classes: list[int], slow: set[int]) -> None:
        """K-class rows to float64 arrays, one numpy call per K; probs rows must sum to 1
        clearly within the tolerance, else Parser (and math.fsum) decides."""
        probs, logits = scores[2], scores[3]
        lists = [probs[j] if kind[j] == 2 else logits[j] for j in rows]
        lens = list(map(len, lists))
        groups: dict[int, list[int]] = {}
        if lens.count(lens[0]) == len(lens):
            groups[lens[0]] = list(range(len(rows)))
        else:
            for q, k in enumerate(lens):
                groups.setdefault(k, []).append(q)
        for k, qs in groups.items():
            block = lists if len(qs) == len(rows) else [lists[q] for q in qs]
            m = np.fromiter(chain.from_iterable(block), np.float64, count=len(qs) * k)
            m = m.reshape(len(qs), k)
            is_probs = np.fromiter((kind[rows[q]] == 2 for q in qs), bool, count=len(qs))
            if is_probs.any():
                off = np.abs(m.sum(axis=1) - 1.0) > PROBS_TOLERANCE - _SUM_MARGIN
                slow.update(rows[qs[b]] for b in np.flatnonzero(off & is_probs).tolist())
            # own copies, as Parser gives: a view would keep the whole block alive for
            # as long as any one row waits for its label
            for q, row in zip(qs, map(np.ndarray.copy, m)):
                j = rows[q]
                vec[j] = row
                classes[j] = k

    def _labels(self, idx: list[int], recs: list[Any], values: Sequence[bytes | None],
                stamps: Sequence[float | None], sources: Sequence[str] | None
                ) -> tuple[list[list[Any]], list[int]]:
        """Columns id, label, ts, model, raw, source of the decoded labels, and the batch
        indices that go slow."""
        if not idx:
            return [[] for _ in range(6)], []
        cols = _columns(recs, self._lcols)
        slow: set[int] = set()
        ids = self._ids(cols["id"], slow)
        labels: list[Any] = list(cols["label"])
        if str in set(map(type, labels)):  # v5: class names, kept as strings till assembly
            labels = [v if type(v) is str else int(v) for v in labels]
            slow.update(j for j, v in enumerate(labels)
                        if type(v) is str and not _name_ok(v, self.max_name_bytes))
        else:
            labels = list(map(int, labels))  # booleans as 0/1
        hints = cols["model"]
        if "" in hints or not self._names.issuperset(filter(None, hints)):
            hints = [h if h is None or self._name(h) else None for h in hints]
        every = len(idx) == len(values)
        ts = self._times(cols["ts"], stamps if every else [stamps[i] for i in idx],
                         False, slow)
        # decoded, so never None
        kept: list[Any] = list(values) if every else [values[i] for i in idx]
        if max(map(len, kept)) > LABEL_RAW_CAP:
            kept = [v if len(v) <= LABEL_RAW_CAP else None for v in kept]
        out: list[list[Any]] = [ids, labels, ts, list(hints), kept,
                                [None] * len(idx) if sources is None
                                else list(sources) if every else [sources[i] for i in idx]]
        return out, [idx[j] for j in slow]

    # ------------------------------------------------------------------ assembly

    def _assemble(self, kinds: Sequence[Kind], raws: list[Raw] | RawBatch, slow: list[int],
                  pidx: list[int], pcols: list[list[Any]], lidx: list[int],
                  lcols: list[list[Any]]) -> Parsed:
        out = Parsed()
        # the slow path below sets its records' codes itself
        code_arr = np.full(len(kinds), LABEL, np.int64)
        code_arr[pidx] = PRED
        codes: list[int] = code_arr.tolist()
        slow_p: list[tuple[int, list[Any]]] = []
        slow_l: list[tuple[int, list[Any]]] = []
        if slow:
            self.slow_calls += len(slow)
            gone = set(slow)
            if gone.intersection(pidx):
                keep = [j for j, i in enumerate(pidx) if i not in gone]
                pidx = [pidx[j] for j in keep]
                pcols = [[c[j] for j in keep] for c in pcols]
            if gone.intersection(lidx):
                keep = [j for j, i in enumerate(lidx) if i not in gone]
                lidx = [lidx[j] for j in keep]
                lcols = [[c[j] for j in keep] for c in lcols]
            parse = self.parser.parse
            for i in slow:
                rec = parse(raws[i])
                if type(rec) is Reject:
                    codes[i] = REJECT
                    out.reasons.append(rec.reason)
                    continue
                one = Parsed()
                one.add(rec)
                if type(rec) is Prediction:
                    codes[i] = PRED
                    slow_p.append((i, [one.p_id[0], one.p_model[0], one.p_ts[0],
                                       one.p_segment[0], one.p_segkey[0], one.p_kind[0],
                                       one.p_classes[0], one.p_score[0], one.p_vec.get(0),
                                       one.p_decision[0]]))
                else:
                    assert type(rec) is Label
                    codes[i] = LABEL
                    slow_l.append((i, [one.l_id[0], one.l_name.get(0, one.l_label[0]), one.l_ts[0],
                                       one.l_model[0], one.l_raw[0], one.l_source[0]]))
        out.kinds = codes
        pcols = _merge(pidx, pcols, slow_p)
        lcols = _merge(lidx, lcols, slow_l)
        (out.p_id, out.p_model, out.p_ts, out.p_segment, out.p_segkey, out.p_kind,
         out.p_classes, out.p_score, vecs, out.p_decision) = pcols
        if out.p_classes.count(0) != len(vecs):
            out.p_vec = {q: v for q, v in enumerate(vecs) if v is not None}
        out.l_id, out.l_label, out.l_ts, out.l_model, out.l_raw, out.l_source = lcols
        labels: list[Any] = out.l_label
        if str in set(map(type, labels)):  # v5: names beside, NAMED in the column
            out.l_name = {q: v for q, v in enumerate(labels) if type(v) is str}
            out.l_label = [NAMED if type(v) is str else v for v in labels]
        return out


def _merge(fast_idx: list[int], cols: list[list[Any]],
           extra: list[tuple[int, list[Any]]]) -> list[list[Any]]:
    """Columns of the fast rows (at batch indices ``fast_idx``, ascending) with the slow
    path's rows (batch index, one value per column) put back in batch order."""
    if not extra:
        return cols
    out: list[list[Any]] = [[] for _ in cols]
    prev = 0
    for i, vals in extra:
        cut = bisect_left(fast_idx, i, prev)
        for o, c, v in zip(out, cols, vals):
            o.extend(c[prev:cut])
            o.append(v)
        prev = cut
    for o, c in zip(out, cols):
        o.extend(c[prev:])
    return out
