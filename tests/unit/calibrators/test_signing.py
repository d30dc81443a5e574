"""Signed calibrator documents (contract v3 §6): Ed25519 over canonical JSON. The
signatures are checked against the ``cryptography`` primitives directly, over bytes the
test builds itself with json.dumps as the contract spells it."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calmon.calibrators import load
from calmon.calibrators.signing import KeyRing, Signer, keygen
from calmon.errors import CalibratorError

DOC = {"model": "ctr", "segment": "__all__", "version": 4, "method": "temperature",
       "params": {"temperature": 1.83, "bias": -0.2}, "input": "logit",
       "fitted_at": "2026-11-30T12:00:00Z", "note": "é ✓"}


def contract_bytes(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def pair() -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode(), base64.b64encode(pub).decode()


def test_the_signature_is_ed25519_over_the_contracts_canonical_json() -> None:
    private, public = pair()
    signed = Signer(private, "k1").sign(DOC)
    assert set(signed) == {*DOC, "signature"}
    assert signed["signature"]["key_id"] == "k1"
    sig = base64.b64decode(signed["signature"]["ed25519"])
    pub = Ed25519PrivateKey.from_private_bytes(base64.b64decode(private)).public_key()
    pub.verify(sig, contract_bytes(DOC))  # raises InvalidSignature if not
    assert load(signed, [{"id": "k1", "public_key": public}]).params()["temperature"] == 1.83


def test_a_document_signed_elsewhere_loads_from_a_file(tmp_path: Path) -> None:
    """A signer that is not calmon (the contract's recipe, done by hand) is accepted."""
    key = Ed25519PrivateKey.generate()
    sig = key.sign(contract_bytes(DOC))
    doc = {**DOC, "signature": {"key_id": "ops", "ed25519": base64.b64encode(sig).decode()}}
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")  # layout is not signed
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    assert load(path, verify_keys=[{"id": "ops", "public_key": pem}]).meta["version"] == 4


def test_unsigned_tampered_and_unknown_documents_are_refused() -> None:
    private, public = pair()
    keys = [{"id": "k1", "public_key": public}]
    signed = Signer(private, "k1").sign(DOC)
    load(signed, keys)
    load(DOC)  # without keys, no signature is needed
    tampered = {**signed, "params": {"temperature": 0.05, "bias": -0.2}}
    renamed = {**signed, "signature": {**signed["signature"], "key_id": "k2"}}
    other, _ = pair()
    forged = Signer(other, "k1").sign(DOC)  # the right id, the wrong key
    for doc, match in ((DOC, "unsigned"), (tampered, "does not verify"),
                       (renamed, "unknown key id"), (forged, "does not verify"),
                       ({**signed, "signature": "x"}, "signature"),
                       ({**signed, "signature": {"key_id": "k1", "ed25519": "%%"}}, "base64"),
                       ({**signed, "signature": {"key_id": "k1", "ed25519": "AAAA"}}, "64")):
        with pytest.raises(CalibratorError, match=match):
            load(doc, keys)


def test_key_rotation() -> None:
    """Old and new public keys while documents of both are live; then the old removed."""
    old_private, old_public = pair()
    new_private, new_public = pair()
    by_old = Signer(old_private, "2026-01").sign(DOC)
    by_new = Signer(new_private, "2026-07").sign({**DOC, "version": 5})
    both = [{"id": "2026-01", "public_key": old_public},
            {"id": "2026-07", "public_key": new_public}]
    assert load(by_old, both).meta["version"] == 4
    assert load(by_new, both).meta["version"] == 5
    only_new = KeyRing.of(both[1:])
    assert load(by_new, only_new).meta["version"] == 5
    with pytest.raises(CalibratorError, match="unknown key id"):
        load(by_old, only_new)


def test_keys_in_every_accepted_form_and_bad_ones() -> None:
    private, public = keygen()
    key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(private))
    pem_private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
    signed = Signer(pem_private, "pem").sign(DOC)
    assert load(signed, [{"id": "pem", "public_key": public}]).meta["model"] == "ctr"
    assert Signer(private, "b64").public_key == public
    for bad in ("", "not base64!", base64.b64encode(b"x" * 31).decode(),
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"):
        with pytest.raises(CalibratorError) as err:
            Signer(bad, "k")
        assert bad == "" or bad not in str(err.value)  # never quotes key material
    for bad_keys in ([{"id": "k", "public_key": "zz"}], [{"id": "", "public_key": public}],
                     [{"id": "k", "public_key": public}, {"id": "k", "public_key": public}],
                     "k"):
        with pytest.raises(CalibratorError):
            load(signed, bad_keys)
    assert "pem" in repr(Signer(pem_private, "pem")) and private not in repr(Signer(private, "x"))
