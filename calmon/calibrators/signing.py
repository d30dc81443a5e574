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
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from calmon.errors import CalibratorError

SIGNATURE: Final = "signature"
RAW_KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
MAX_KEY_ID: Final = 256


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


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise CalibratorError(f"{what} is neither PEM nor base64") from None


def private_key(text: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from base64 of its raw 32 bytes, or from PEM (PKCS#8)."""
    key = _key(text, "the signing key", lambda pem: serialization.load_pem_private_key(pem, None),
               Ed25519PrivateKey.from_private_bytes)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 of its raw 32 bytes, or from PEM."""
    key = _key(text, "the public key", serialization.load_pem_public_key,
               Ed25519PublicKey.from_public_bytes)
    assert isinstance(key, Ed25519PublicKey)
    return key


def _key(text: str, what: str, from_pem: Callable[[bytes], object],
         from_raw: Callable[[bytes], object]) -> object:
    """``what`` from PEM or base64 of its raw bytes; every failure a CalibratorError."""
    if not isinstance(text, str):
        raise CalibratorError(f"{what} must be a string")
    if "-----BEGIN" in text:
        try:
            key = from_pem(text.encode("ascii", "replace"))
        except (ValueError, TypeError, binascii.Error):
            raise CalibratorError(f"{what} is not readable PEM") from None
        if not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
            raise CalibratorError(f"{what} is not an Ed25519 key")
        return key
    raw = _b64(text, what)
    if len(raw) != RAW_KEY_BYTES:
        raise CalibratorError(f"{what} must be {RAW_KEY_BYTES} bytes, got {len(raw)}")
    return from_raw(raw)


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keygen() -> tuple[str, str]:
    """A new key pair: (private, public), each base64 of the raw 32 bytes."""
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    return base64.b64encode(raw).decode(), base64.b64encode(raw_public(key.public_key())).decode()


class Signer:
    """Signs documents with one private key, named ``key_id`` in every signature."""

    def __init__(self, key: str, key_id: str) -> None:
        if not isinstance(key_id, str) or not key_id or len(key_id) > MAX_KEY_ID:
            raise CalibratorError(f"a key id must be a string of 1 to {MAX_KEY_ID} characters")
        self._key = private_key(key)
        self.key_id = key_id
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
