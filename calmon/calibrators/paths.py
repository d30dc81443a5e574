"""One spelling of model names and segment values as directory names.

Used by the publisher (calmon.recal.registry) and by CalibratorWatcher alike, so
both always agree, and every name maps to exactly one directory directly inside
its parent: ``/``, ``\\``, control characters and ``%`` are percent-encoded,
``.``/``..``/empty names are encoded whole, and names whose encoding is longer
than MAX_COMPONENT bytes become a truncated prefix plus a hash of the full name.
"""

from __future__ import annotations

import hashlib
from typing import Final
from urllib.parse import quote

MAX_COMPONENT: Final = 120  # bytes; far below NAME_MAX (255) on every common file system
_SAFE: Final = "=,_-.:@+"


def dir_name(name: str) -> str:
    """``name`` as one path component: never ``.``, ``..``, empty, or containing a
    separator, and at most MAX_COMPONENT bytes. Distinct names give distinct results."""
    if name in ("", ".", ".."):
        return "%2E" * len(name) if name else "%00empty"
    enc = quote(name, safe=_SAFE, errors="surrogatepass")
    if len(enc) <= MAX_COMPONENT:
        return enc
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    head = enc[:MAX_COMPONENT - 18]
    cut = head.rfind("%", len(head) - 2)  # never split a %XX escape
    if cut != -1:
        head = head[:cut]
    return f"{head}~{digest}"
