"""The typed msgspec Structs the batch parser decodes records into: one Struct per
configured field layout, built from the ``fields.*`` dotted paths, and the columns read
back out of a list of them (``fastparse`` holds the parser itself)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec


class Leaf:
    """One configured field: its Struct attribute, type, and whether it is required (a
    required field missing or null fails the decode, so the record goes slow)."""

    __slots__ = ("attr", "default", "required", "tp")

    def __init__(self, attr: str, tp: Any, required: bool, default: Any = None) -> None:
        self.attr, self.tp, self.required, self.default = attr, tp, required, default


def build_struct(name: str, leaves: dict[str, tuple[str, Leaf]]
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
            if isinstance(sub, Leaf):
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


def columns(recs: list[Any], chains: dict[str, tuple[str, ...]]) -> dict[str, Sequence[Any]]:
    """Each configured field as a column (None where a nested object is absent). One C
    getter a field: transposing the Structs as tuples is faster alone, but its thousands
    of short-lived tuples set off collections that cost more."""
    out: dict[str, Sequence[Any]] = {}
    for name, attrs in chains.items():
        col: Sequence[Any] = list(map(attrgetter(attrs[0]), recs))
        for attr in attrs[1:]:
            col = [getattr(x, attr, None) for x in col]
        out[name] = col
    return out
