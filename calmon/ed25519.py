"""Ed25519 key material as config and documents spell it: base64 of the raw 32 bytes,
or PEM. Below config and the calibrators, so that config checks its keys at load
without importing what signs (``calibrators/signing.py``). The primitives come from
``cryptography`` (OpenSSL). Error messages never quote key material.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from calmon.errors import CalibratorError

RAW_KEY_BYTES: Final = 32
MAX_KEY_ID: Final = 256


def from_base64(text: str, what: str) -> bytes:
    """Strict base64 (whitespace ignored); a CalibratorError naming ``what`` otherwise."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise CalibratorError(f"{what} is neither PEM nor base64") from None


def check_key_id(key_id: object) -> str:
    """``key_id`` when it is a string of 1 to MAX_KEY_ID characters."""
    if not isinstance(key_id, str) or not key_id or len(key_id) > MAX_KEY_ID:
        raise CalibratorError(f"a key id must be a string of 1 to {MAX_KEY_ID} characters")
    return key_id


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
    raw = from_base64(text, what)
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
