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

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta
from orjson import loads as _orjson_loads

from calmon.config import FieldsConfig, LimitsConfig
from calmon.engine.parsed import LABEL, PRED, REJECT, Parsed
from calmon.engine.records import (
    _CONTROL,
    _GOOD_NAMES_CAP,
    LABEL_RAW_CAP,
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
_SCORE_BIT = {1: 0, 2: 1, 4: 2, 8: 3}  # one score field present -> its ScoreKind


class _Leaf:
    """One configured field: its Struct attribute, type, and whether it is required (a
    required field missing or null fails the decode, so the record goes slow)."""

    __slots__ = ("attr", "default", "required", "tp")

    def __init__(self, attr: str, tp: Any, required: bool, default: Any = None) -> None:
        self.attr, self.tp, self.required, self.default = attr, tp, required, default


def _build_struct(name: str, leaves: dict[str, tuple[str, _Leaf]]
                  ) -> type[msgspec.Struct] | None:
    """A Struct reading each leaf at its dotted path (nested Structs for the prefixes),
    or None when two paths clash (equal, or one inside the other): such configs always
    take the slow path. Attribute names are synthetic; JSON names come by ``rename``."""
    tree: dict[str, Any] = {}
    for path, leaf in leaves.values():
        parts = path.split(".") if "." in path else [path]
        node = tree
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                return None
            node = child
        if parts[-1] in node:
            return None
        node[parts[-1]] = leaf
    counter = iter(range(10**6))

    def make(node: dict[str, Any], label: str) -> tuple[type[msgspec.Struct], bool]:
        fields: list[tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        required_any = False
        for key, sub in node.items():
            if isinstance(sub, _Leaf):
                attr, tp, required, default = sub.attr, sub.tp, sub.required, sub.default
            else:
                attr = f"n{next(counter)}"
                tp, required = make(sub, f"{label}_{attr}")
                default = None
                if not required:
                    tp = tp | None
            required_any |= required
            rename[attr] = key
            fields.append((attr, tp) if required else (attr, tp, default))  # type: ignore[arg-type]
        st = msgspec.defstruct(label, fields, rename=rename, kw_only=True, gc=False)
        return st, required_any

    # a non-object where an object is expected fails the decode: the slow path decides
    return make(tree, name)[0]


def _column(structs: Sequence[Any], chain_: tuple[str, ...]) -> list[Any]:
    """The values at one attribute path (None where a nested object is absent)."""
    try:
        return list(map(attrgetter(".".join(chain_)), structs))
    except AttributeError:  # an absent (None) nested object on the way
        col = list(map(attrgetter(chain_[0]), structs))
        for a in chain_[1:]:
            col = [getattr(x, a, None) for x in col]
        return col


class BatchParser:
    """``Parser`` over a whole batch: ``parse(raws).same(Parsed.from_records(
    [Parser(...).parse(r) for r in raws]))`` for every input and setting."""

    def __init__(self, fields: FieldsConfig, max_record_bytes: int,
                 limits: LimitsConfig | None = None, max_clock_skew: float | None = None) -> None:
        self.parser = Parser(fields, max_record_bytes, limits, max_clock_skew)  # the slow path
        limits = limits if limits is not None else LimitsConfig()
        self.max_bytes = max_record_bytes
        self.max_id_bytes = limits.max_id_bytes
        self.max_name_bytes = limits.max_name_bytes
        self.max_clock_skew = math.inf if max_clock_skew is None else max_clock_skew
        # live only: wall clock + max_clock_skew, set per batch by the caller (Parser.not_after)
        self.not_after = math.inf
        self.slow_calls = 0  # records handed to Parser.parse, for tests and profiling
        self._names: set[str] = set()  # model names already found safe (bounded)
        self._segments: dict[bytes, dict[str, str]] = {b"null": {}}  # spelling -> segment

        max_id, max_name, max_k = limits.max_id_bytes, limits.max_name_bytes, limits.max_classes
        id_t = (Annotated[str, Meta(min_length=1, max_length=max_id)]
                | Annotated[int, Meta(gt=-(10**18), lt=10**18)])
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
        label: dict[str, tuple[str, _Leaf]] = {
            "id": (fields.id, _Leaf("id", id_t, True)),
            "label": (fields.label, _Leaf("label", Annotated[int, Meta(ge=0, le=2**63 - 1)] | bool,
                                          True)),
            "model": (fields.model, _Leaf("model", str | None, False)),
            "ts": (fields.ts, _Leaf("ts", ts_t, False)),
        }
        self._pstruct = _build_struct("FastPrediction", pred)
        self._lstruct = _build_struct("FastLabel", label)
        self._decoders: dict[Kind, Callable[[bytes], Any]] = {}
        for kind, st in ((_PREDICTION, self._pstruct), (_LABEL, self._lstruct)):
            if st is not None:
                self._decoders[kind] = msgspec.json.Decoder(st).decode
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

    def parse(self, raws: list[Raw]) -> Parsed:
        n = len(raws)
        if n == 0:
            return Parsed()
        self.parser.not_after = self.not_after
        kinds, values, stamps, sources = zip(*raws)
        structs = self._decode(kinds, values)
        slow = [i for i, s in enumerate(structs) if s is None] if None in structs else []

        pst, lst = self._pstruct, self._lstruct
        pidx = [i for i, s in enumerate(structs) if type(s) is pst] if pst is not None else []
        lidx = [i for i, s in enumerate(structs) if type(s) is lst] if lst is not None else []
        pcols, pslow = self._predictions(pidx, structs, stamps)
        lcols, lslow = self._labels(lidx, structs, values, stamps, sources)
        if pslow or lslow:
            slow = sorted(chain(slow, pslow, lslow))
        return self._assemble(kinds, raws, slow, pidx, pcols, lidx, lcols)

    def _decode(self, kinds: Sequence[Kind], values: Sequence[bytes | None]) -> list[Any]:
        """One Struct per record, or None where the slow path must decide."""
        decoders = self._decoders
        pre: set[int] = set()  # records the guards send to the slow path
        try:
            joined = b"\n".join(values)  # type: ignore[arg-type]  # None raises TypeError
        except TypeError:  # a None value (a tombstone): the slow path says empty
            pre = {i for i, v in enumerate(values) if v is None}
            joined = b"\n".join(v for v in values if v is not None)
        # msgspec does not check UTF-8 in fields it skips; an ASCII separator cannot
        # complete a truncated sequence, so the join decodes iff every value does
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
        if not pre and len(decoders) == 2:
            try:  # the common case: one comprehension, no per-record try
                return [decoders[k](v) for k, v in zip(kinds, values)]  # type: ignore[arg-type]
            except Exception:  # any refusal: decided record by record below
                pass
        out: list[Any] = []
        for i, (k, v) in enumerate(zip(kinds, values)):
            dec = decoders.get(k)
            if i in pre or dec is None or v is None:
                out.append(None)
                continue
            try:
                out.append(dec(v))
            except Exception:  # decode errors, recursion: Parser decides
                out.append(None)
        return out

    # ------------------------------------------------------------------ columns

    def _ids(self, structs: list[Any], chain_: tuple[str, ...], slow: set[int]) -> list[str]:
        raw = _column(structs, chain_)
        ids = list(map(str, raw))  # str of a str is itself; ints as Parser writes them
        lim = self.max_id_bytes // 4  # this many code points fit in the byte limit
        if ids and max(map(len, ids)) > lim:
            slow.update(j for j, (s, o) in enumerate(zip(ids, raw))
                        if len(s) > lim and type(o) is str
                        and len(s.encode("utf-8")) > self.max_id_bytes)
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

    def _times(self, ts: list[float | None], stamps: list[float | None], required: bool,
               slow: set[int]) -> list[float | None]:
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
                return ts
            if unstamped == n:
                if missing and required:
                    slow.update(j for j, s in enumerate(ts) if s is None)
                t = np.array(ts, np.float64)
                slow.update(np.flatnonzero(t > na).tolist())
                return ts
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

    def _segments_of(self, raw: list[Any], slow: set[int]) -> tuple[list[dict[str, str]],
                                                                    list[bytes]]:
        try:
            keys = list(map(bytes, raw))
        except TypeError:  # an absent nested object on the way
            keys = [bytes(x) if x is not None else b"" for x in raw]
        cache = self._segments
        segs = list(map(cache.get, keys))
        if None in segs:
            for j, (seg, key) in enumerate(zip(segs, keys)):
                if seg is not None:
                    continue
                if not key:  # absent
                    segs[j] = {}
                    continue
                found = self._segment(key)
                if found is None:
                    slow.add(j)
                    continue
                segs[j] = found
                if len(key) <= _SEG_CACHE_BYTES:
                    if len(cache) >= _SEG_CACHE_CAP:
                        cache.clear()
                        cache[b"null"] = {}
                    cache[key] = found
        return segs, keys  # type: ignore[return-value]  # None only where slow

    def _predictions(self, idx: list[int], structs: list[Any], stamps: Sequence[float | None]
                     ) -> tuple[list[list[Any]], list[int]]:
        """Columns id, model, ts, segment, segkey, kind, classes, score, vec (a K-class row
        or None) of the decoded predictions, and the batch indices that go slow."""
        if not idx:
            return [[] for _ in range(9)], []
        cols = self._pcols
        recs = [structs[i] for i in idx]
        n = len(recs)
        slow: set[int] = set()
        ids = self._ids(recs, cols["id"], slow)
        models = _column(recs, cols["model"])
        if not self._names.issuperset(models):
            slow.update(j for j, m in enumerate(models) if not self._name(m))
        scores = [_column(recs, cols[k]) for k in SCORE_KINDS]
        classes = [0] * n
        present = [n - c.count(None) for c in scores]
        vec_rows: list[int]
        if present.count(0) == 3 and n in present:  # one score kind throughout
            code = present.index(n)
            kind = [code] * n
            if code < 2:
                score = scores[code]
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
            vec_rows = [j for j, k in enumerate(kind) if k >= 2]
        vec: list[np.ndarray | None] = [None] * n
        if vec_rows:
            self._vectors(vec_rows, kind, scores, vec, classes, slow)
        pstamps = [stamps[i] for i in idx]
        ts = self._times(_column(recs, cols["ts"]), pstamps, True, slow)
        segs, keys = self._segments_of(_column(recs, cols["segment"]), slow)
        out = [ids, models, ts, segs, keys, kind, classes, score, vec]
        return out, [idx[j] for j in slow]

    def _vectors(self, rows: list[int], kind: list[int], scores: list[list[Any]],
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

    def _labels(self, idx: list[int], structs: list[Any], values: Sequence[bytes | None],
                stamps: Sequence[float | None], sources: Sequence[str]
                ) -> tuple[list[list[Any]], list[int]]:
        """Columns id, label, ts, model, raw, source of the decoded labels, and the batch
        indices that go slow."""
        if not idx:
            return [[] for _ in range(6)], []
        cols = self._lcols
        recs = [structs[i] for i in idx]
        slow: set[int] = set()
        ids = self._ids(recs, cols["id"], slow)
        labels = list(map(int, _column(recs, cols["label"])))  # booleans as 0/1
        hints = _column(recs, cols["model"])
        if "" in hints or not self._names.issuperset(filter(None, hints)):
            hints = [h if h is None or self._name(h) else None for h in hints]
        ts = self._times(_column(recs, cols["ts"]), [stamps[i] for i in idx], False, slow)
        kept: list[bytes | None] = [values[i] for i in idx]
        if max(map(len, kept)) > LABEL_RAW_CAP:  # type: ignore[arg-type]
            kept = [v if len(v) <= LABEL_RAW_CAP else None for v in kept]  # type: ignore[arg-type]
        out: list[list[Any]] = [ids, labels, ts, hints, kept, [sources[i] for i in idx]]
        return out, [idx[j] for j in slow]

    # ------------------------------------------------------------------ assembly

    def _assemble(self, kinds: Sequence[Kind], raws: list[Raw], slow: list[int],
                  pidx: list[int], pcols: list[list[Any]], lidx: list[int],
                  lcols: list[list[Any]]) -> Parsed:
        out = Parsed()
        codes = [PRED if k is _PREDICTION else LABEL for k in kinds]
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
                                       one.p_classes[0], one.p_score[0], one.p_vec.get(0)]))
                else:
                    assert type(rec) is Label
                    codes[i] = LABEL
                    slow_l.append((i, [one.l_id[0], one.l_label[0], one.l_ts[0],
                                       one.l_model[0], one.l_raw[0], one.l_source[0]]))
        out.kinds = codes
        pcols = _merge(pidx, pcols, slow_p)
        lcols = _merge(lidx, lcols, slow_l)
        (out.p_id, out.p_model, out.p_ts, out.p_segment, out.p_segkey, out.p_kind,
         out.p_classes, out.p_score, vecs) = pcols
        if out.p_classes.count(0) != len(vecs):
            out.p_vec = {q: v for q, v in enumerate(vecs) if v is not None}
        out.l_id, out.l_label, out.l_ts, out.l_model, out.l_raw, out.l_source = lcols
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
