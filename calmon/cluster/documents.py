"""What the owner takes from ``calibrators_topic`` into ``output_dir`` (contract §6, §7).

Anyone who can write the topic writes what every instance copies and serves, so a
record is a document only once it passed what serving code's watcher checks: bounded
JSON without duplicate keys (``parse_document``), every field in range
(``calibrators.validate``), a trusted signature when signing is on, a calibrator that
builds, and the key ``<model>/<segment>`` it was published under (compaction keeps one
record per key). Anything else is refused with a reason
(``calmon_invalid_records_total{topic=<calibrators topic>, reason}``), dead-lettered and
skipped: nothing of it is written. Markers (``kafka.MARKER_PREFIX`` keys, no ``model``
or ``segment``) are no documents and no refusals either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from calmon.calibrators import load
from calmon.calibrators.registry import parse_document
from calmon.calibrators.signing import KeyRing, Signer, keyring
from calmon.calibrators.validate import check_document
from calmon.cluster.checks import Refused
from calmon.errors import CalibratorError

MARKER_PREFIX: Final = "__calmon_marker__/"
CALIBRATOR_REASONS: Final = (
    "not_json",  # not bounded, plain JSON (size, nesting, NaN, duplicate keys)
    "bad_document",  # not a calibrator document calmon could serve (fields, ranges)
    "bad_signature",  # unsigned, forged, or signed by an unknown key (signing on)
    "bad_key",  # not keyed <model>/<segment> of the document
)


def trusted_keys(cal: Any) -> KeyRing | None:
    """The keys an owner trusts (``calibrators:``): ``verify_keys``, else, with a
    ``signing_key``, the instances' shared key; None when signing is off."""
    signer = Signer.from_config(cal)
    return keyring(cal.verify_keys) or (
        None if signer is None else KeyRing.of([{"id": signer.key_id,
                                                 "public_key": signer.public_key}]))


def document(key: bytes | None, value: bytes | None,
             keys: KeyRing | None) -> dict[str, Any] | None:
    """The document a record holds; None for a marker or a tombstone; raises Refused."""
    if value is None:
        return None  # a tombstone: compaction's, never a document
    try:
        doc = parse_document(value)
    except CalibratorError as e:
        raise Refused("not_json", str(e)) from None
    if not isinstance(doc, Mapping):
        raise Refused("bad_document", "not a JSON object")
    if "model" not in doc and "segment" not in doc and (
            key or b"").startswith(MARKER_PREFIX.encode()):
        return None  # a read-back marker (§7: its own key, no model or segment)
    try:
        check_document(doc)
    except CalibratorError as e:
        raise Refused("bad_document", str(e)) from None
    if keys is not None:
        try:
            keys.verify(doc)
        except CalibratorError as e:
            raise Refused("bad_signature", str(e)) from None
    if key != f"{doc['model']}/{doc['segment']}".encode("utf-8", "surrogatepass"):
        raise Refused("bad_key", "not keyed <model>/<segment> of the document")
    try:
        load(doc, keys)
    except CalibratorError as e:
        raise Refused("bad_document", str(e)) from None
    return dict(doc)
