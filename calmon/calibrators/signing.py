"""Signed calibrator documents (contract v3 §6): Ed25519 over canonical JSON.

A shared secret (HMAC) would put the key that forges documents into every serving pod;
with Ed25519 only calmon holds the private key and serving code holds public keys. The
primitives come from ``cryptography`` (OpenSSL), never from hand-written code.

    signed = Signer(private_key, "k2026").sign(doc)   # adds "signature"
    KeyRing.of([{"id": "k2026", "public_key": pub}]).verify(signed)

Keys are base64 of the raw 32 bytes or PEM. Error messages never quote key material.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from calmon.ed25519 import MAX_KEY_ID as MAX_KEY_ID  # re-exported: the key text lives below
from calmon.ed25519 import RAW_KEY_BYTES as RAW_KEY_BYTES
from calmon.ed25519 import check_key_id
from calmon.ed25519 import from_base64 as _b64
from calmon.ed25519 import keygen as keygen
from calmon.ed25519 import private_key as private_key
from calmon.ed25519 import public_key as public_key
from calmon.ed25519 import raw_public as raw_public
from calmon.errors import CalibratorError

SIGNATURE: Final = "signature"
SIGNATURE_BYTES: Final = 64


def canonical(doc: Mapping[str, Any]) -> bytes:
    """The signed bytes: the document without its ``signature``, as Python's
    ``json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` in UTF-8."""
    body = {k: v for k, v in doc.items() if k != SIGNATURE}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError: surrogates
        raise CalibratorError(f"not a JSON document: {str(exc)[:200]}") from None


class Signer:
    """Signs documents with one private key, named ``key_id`` in every signature."""

    def __init__(self, key: str, key_id: str) -> None:
        self.key_id = check_key_id(key_id)
        self._key = private_key(key)
        self.public_key = base64.b64encode(raw_public(self._key.public_key())).decode()

    def sign(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``doc`` with ``signature``: {key_id, ed25519 (base64)}."""
        sig = self._key.sign(canonical(doc))
        body = {k: v for k, v in doc.items() if k != SIGNATURE}
        return {**body, SIGNATURE: {"key_id": self.key_id,
                                    "ed25519": base64.b64encode(sig).decode()}}

    def sign_bytes(self, data: bytes) -> str:
        """``<key_id>:<base64 ed25519>`` over raw bytes (a joined batch, contract §7)."""
        return f"{self.key_id}:{base64.b64encode(self._key.sign(data)).decode()}"

    def __repr__(self) -> str:  # never the key
        return f"Signer(key_id={self.key_id!r})"

    @classmethod
    def from_config(cls, cal: Any) -> Signer | None:
        """From ``calibrators:`` of the config (signing_key, key_id); None when unset."""
        if getattr(cal, "signing_key", None) is None:
            return None
        return cls(cal.signing_key, cal.key_id)


class KeyRing:
    """Public keys by id: what a reader trusts. Keys rotate by listing the old and the
    new one while documents signed by either are live, then dropping the old."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        self.keys = dict(keys)

    @classmethod
    def of(cls, entries: Iterable[Any]) -> KeyRing:
        """From ``[{"id", "public_key"}]`` (mappings, or objects with those attributes)."""
        keys: dict[str, Ed25519PublicKey] = {}
        for i, entry in enumerate(entries):
            if isinstance(entry, Mapping):
                kid, pub = entry.get("id"), entry.get("public_key")
            else:
                kid, pub = getattr(entry, "id", None), getattr(entry, "public_key", None)
            if not isinstance(kid, str) or not kid or len(kid) > MAX_KEY_ID:
                raise CalibratorError(f"verify_keys[{i}].id: a string of 1 to {MAX_KEY_ID} "
                                      "characters")
            if kid in keys:
                raise CalibratorError(f"verify_keys[{i}].id: {kid!r} given twice")
            try:
                keys[kid] = public_key(pub)  # type: ignore[arg-type]
            except CalibratorError as exc:
                raise CalibratorError(f"verify_keys[{i}].public_key: {exc}") from None
        return cls(keys)

    def verify(self, doc: Mapping[str, Any]) -> None:
        """CalibratorError unless ``doc`` is signed by one of these keys."""
        sig = doc.get(SIGNATURE)
        if sig is None:
            raise CalibratorError("unsigned document (verify_keys are set)")
        if not isinstance(sig, Mapping) or set(sig) != {"key_id", "ed25519"}:
            raise CalibratorError('signature must be {"key_id": ..., "ed25519": ...}')
        kid, value = sig["key_id"], sig["ed25519"]
        if not isinstance(kid, str) or kid not in self.keys:
            shown = kid[:100] if isinstance(kid, str) else kid
            raise CalibratorError(f"signed by an unknown key id {shown!r}")
        if not isinstance(value, str) or len(value) > 200:
            raise CalibratorError("signature.ed25519 must be base64 of 64 bytes")
        raw = _b64(value, "signature.ed25519")
        if len(raw) != SIGNATURE_BYTES:
            raise CalibratorError("signature.ed25519 must be base64 of 64 bytes")
        try:
            self.keys[kid].verify(raw, canonical(doc))
        except InvalidSignature:
            raise CalibratorError(f"signature by key {kid!r} does not verify") from None

    def verify_bytes(self, data: bytes, signature: str | None) -> None:
        """CalibratorError unless ``signature`` (``Signer.sign_bytes``) signs ``data``
        with one of these keys."""
        if not signature:
            raise CalibratorError("unsigned (verify_keys are set)")
        kid, _, value = signature.partition(":")
        if kid not in self.keys:
            raise CalibratorError(f"signed by an unknown key id {kid[:100]!r}")
        raw = _b64(value[:200], "signature")
        if len(raw) != SIGNATURE_BYTES:
            raise CalibratorError("a signature must be base64 of 64 bytes")
        try:
            self.keys[kid].verify(raw, data)
        except InvalidSignature:
            raise CalibratorError(f"signature by key {kid!r} does not verify") from None

    def __len__(self) -> int:
        return len(self.keys)


def keyring(verify_keys: Any) -> KeyRing | None:
    """None (no signatures needed) for None or an empty list; else a KeyRing."""
    if verify_keys is None or isinstance(verify_keys, KeyRing):
        return verify_keys if verify_keys is None or len(verify_keys) else None
    if isinstance(verify_keys, str | bytes | Mapping):
        raise CalibratorError("verify_keys must be a list of {id, public_key}")
    ring = KeyRing.of(verify_keys)
    return ring if len(ring) else None
