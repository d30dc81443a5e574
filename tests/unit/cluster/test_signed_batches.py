"""With calibrators.signing_key, joined batches are authenticated too (contract §7): the
owner takes only batches signed by a trusted key."""

from __future__ import annotations

from pathlib import Path

from calmon import config as config_mod
from calmon.calibrators.signing import Signer, keygen
from calmon.cluster.batch import JoinedBatch, encode
from calmon.cluster.kafka import SIGNATURE_HEADER, signed_bytes
from calmon.cluster.service import Cluster


def cluster(tmp_path: Path, private: str, public: str | None) -> Cluster:
    return Cluster(config_mod.from_dict({
        "kafka": {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
                  "calibrators_topic": "c"},
        "recalibration": {"output_dir": str(tmp_path / "cal")},
        "calibrators": {"signing_key": private, "key_id": "k1",
                        "verify_keys": [] if public is None else
                        [{"id": "k1", "public_key": public}]}}))


def test_only_batches_signed_by_a_trusted_key_are_taken(tmp_path: Path) -> None:
    private, public = keygen()
    other, _ = keygen()
    data = encode(JoinedBatch("m", 1.0, 0, {("p", 0): (0, 5)}, []))
    good = Signer(private, "k1").sign_bytes(signed_bytes(b"m", data)).encode()
    for c in (cluster(tmp_path, private, public), cluster(tmp_path, private, None)):
        assert c._unauthentic(b"m", data, [(SIGNATURE_HEADER, good)]) is None
        assert c._unauthentic(b"m", data + b"x", [(SIGNATURE_HEADER, good)]) is not None
        # the signature covers the key: replayed under another key (so onto another
        # partition of the joined topic) it does not verify
        assert c._unauthentic(b"n", data, [(SIGNATURE_HEADER, good)]) is not None
        assert c._unauthentic(None, data, [(SIGNATURE_HEADER, good)]) is not None
        assert "unsigned" in (c._unauthentic(b"m", data, []) or "")
        forged = Signer(other, "k1").sign_bytes(signed_bytes(b"m", data)).encode()
        assert "does not verify" in (
            c._unauthentic(b"m", data, [(SIGNATURE_HEADER, forged)]) or "")
        unknown = Signer(private, "k9").sign_bytes(signed_bytes(b"m", data)).encode()
        assert "unknown key" in (
            c._unauthentic(b"m", data, [(SIGNATURE_HEADER, unknown)]) or "")
        c.owner.reject(3, 41, "joined batch refused")
        assert c.owner.bad == 1 and c.owner.offsets == {3: 42}
        assert c.invalid()[("j", "bad_signature")] == 1
