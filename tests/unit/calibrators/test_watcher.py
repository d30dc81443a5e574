"""CalibratorWatcher on a directory (contract v3 §6): serves what is there from its first
apply(), refuses forged or broken documents while the last good one keeps serving and the
other documents of the same scan are applied, parses off the apply() path, and returns
the model's own probability without a calibrator. Expected outputs are scipy's."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import CalibratorWatcher
from calmon.calibrators import watcher as watcher_mod
from calmon.calibrators.signing import Signer, keygen
from calmon.errors import CalibratorError
from tests.daemon_helpers import wait_until

Z = np.array([-4.0, -0.3, 0.0, 0.1, 2.5, 9.0])
ZZ = np.random.default_rng(3).normal(0, 2, (50, 4))


def doc(model: str, version: int, t: float = 2.0, **extra: Any) -> dict[str, Any]:
    return {"model": model, "segment": "__all__", "version": version,
            "method": "temperature", "params": {"temperature": t}, "input": "logit", **extra}


def intent(version: int, t: float) -> dict[str, Any]:
    return {**doc("intent", version, t), "input": "logits"}


class Tree:
    """An output_dir as calmon writes it: <model>/<segment>/latest.json, replaced whole."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stamp = 1_700_000_000_000_000_000

    def write(self, model: str, content: dict[str, Any] | bytes,
              segment: str = "__all__") -> None:
        d = self.root / model / segment
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "latest.json.tmp"
        tmp.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        self.stamp += 1_000_000  # a new mtime every time, however fast the writes
        os.utime(tmp, ns=(self.stamp, self.stamp))
        os.replace(tmp, d / "latest.json")


def served(w: CalibratorWatcher, model: str, t: float) -> None:
    if model == "intent":
        expected = softmax(ZZ / t, axis=1)
        np.testing.assert_allclose(w.apply("intent", ZZ), expected, rtol=1e-12, atol=1e-15)
    else:
        np.testing.assert_allclose(w.apply(model, Z), np.clip(expit(Z / t), 1e-7, 1 - 1e-7),
                                   rtol=1e-12)


def test_a_directory_watcher_serves_from_its_first_apply(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.write("ctr", doc("ctr", 4, 1.5))
    tree.write("intent", intent(2, 3.0))
    with CalibratorWatcher(tmp_path, min_interval=60.0) as w:  # no refresh comes soon
        assert w.version("ctr") == 4 and w.version("intent") == 2
        served(w, "ctr", 1.5)
        served(w, "intent", 3.0)
        assert w.wait_ready(0)


def test_the_refresh_thread_swaps_in_new_versions(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.write("ctr", doc("ctr", 1, 1.5))
    with CalibratorWatcher(tmp_path, min_interval=0.05) as w:
        assert w.version("ctr") == 1
        tree.write("ctr", doc("ctr", 2, 0.8))
        wait_until(lambda: w.version("ctr") == 2, 30, "the watcher at v2")
        served(w, "ctr", 0.8)


PRIVATE, PUBLIC = keygen()
SIGNER = Signer(PRIVATE, "k1")
KEYS = [{"id": "k1", "public_key": PUBLIC}]

# The forged and broken documents, each as the next version of "ctr" (v1, T=1.5).
BROKEN: dict[str, Callable[[], dict[str, Any] | bytes]] = {
    "401-digit integer": lambda: doc("ctr", 2, 10**400),
    "version 10^30": lambda: doc("ctr", 10**30),
    "version jump past 1000": lambda: doc("ctr", 1002),
    "probs on a binary model": lambda: {**doc("ctr", 2), "input": "probs"},
    "inverted Platt": lambda: {**doc("ctr", 2), "method": "platt",
                               "params": {"a": -5.0, "b": 0.0}},
    "T = 1e-300": lambda: doc("ctr", 2, 1e-300),
    "isotonic outputs 0 and 1": lambda: {**doc("ctr", 2), "method": "isotonic", "input": "logit",
                                         "params": {"x": [0.1, 0.9], "y": [0.0, 1.0]}},
    "14 MB isotonic": lambda: (json.dumps({**doc("ctr", 2), "method": "isotonic",
                                           "params": {"x": list(np.linspace(0, 1, 600_000)),
                                                      "y": list(np.linspace(0.01, 0.99,
                                                                            600_000))}})
                               .encode()),
    "not JSON": lambda: b"{not json",
    "another model's name": lambda: doc("other", 2),
}
SIGNED_BROKEN: dict[str, Callable[[], dict[str, Any]]] = {
    "unsigned": lambda: doc("ctr", 2, 0.5),
    "tampered": lambda: {**SIGNER.sign(doc("ctr", 2, 0.9)), "params": {"temperature": 0.5}},
    "unknown key id": lambda: Signer(keygen()[0], "k9").sign(doc("ctr", 2, 0.5)),
}


def _sign(d: dict[str, Any], signed: bool) -> dict[str, Any]:
    return SIGNER.sign(d) if signed else d


@pytest.mark.parametrize("signed", [False, True])
def test_refused_documents_keep_the_last_good_one_and_the_rest_of_the_scan_applies(
        tmp_path: Path, signed: bool) -> None:
    tree = Tree(tmp_path)
    tree.write("ctr", _sign(doc("ctr", 1, 1.5), signed))
    tree.write("intent", _sign(intent(1, 3.0), signed))
    cases = {**BROKEN, **(SIGNED_BROKEN if signed else {})}
    w = CalibratorWatcher(tmp_path, background=False, verify_keys=KEYS if signed else None)
    try:
        for i, (name, make) in enumerate(cases.items(), start=2):
            bad = make()
            tree.write("ctr", _sign(bad, signed) if isinstance(bad, dict) and signed
                       and name not in SIGNED_BROKEN else bad)
            tree.write("intent", _sign(intent(i, 1.0 + i / 10), signed))  # same scan
            assert w.refresh(force=True), name
            assert w.version("ctr") == 1, name
            served(w, "ctr", 1.5)
            assert w.version("intent") == i, name
            served(w, "intent", 1.0 + i / 10)
            assert w.refusals() == {"ctr/__all__": i - 1}, name
        # a good next version is still taken after all that
        tree.write("ctr", _sign(doc("ctr", 2, 0.7), signed))
        assert w.refresh(force=True) and w.version("ctr") == 2
        served(w, "ctr", 0.7)
    finally:
        w.close()


def test_apply_answers_while_a_14_mb_document_is_being_refreshed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refresh thread is held inside reading a 14 MB document of another model;
    apply() answers meanwhile, and the refresh then refuses the document."""
    tree = Tree(tmp_path)
    tree.write("ctr", doc("ctr", 1, 1.5))
    inside, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = watcher_mod.read_document

    def held_read(path: Any) -> Any:
        if "big" in str(path):
            inside.set()
            release.wait(60)
            try:
                return real(path)
            finally:
                finished.set()
        return real(path)

    monkeypatch.setattr(watcher_mod, "read_document", held_read)
    with CalibratorWatcher(tmp_path, min_interval=0.05) as w:
        tree.write("big", BROKEN["14 MB isotonic"]())
        assert (tmp_path / "big" / "__all__" / "latest.json").stat().st_size > 14_000_000
        assert inside.wait(30), "the refresh never reached the big document"
        for _ in range(100):
            served(w, "ctr", 1.5)
        assert not finished.is_set()  # every apply returned while the refresh was running
        release.set()
        wait_until(lambda: w.refusals() == {"big/__all__": 1}, 30, "the big document refused")
        served(w, "ctr", 1.5)


def test_without_a_calibrator_apply_returns_the_models_own_probability(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.write("ctr", doc("ctr", 1, 1.5))
    with CalibratorWatcher(tmp_path, background=False) as w:
        z = np.array([0.1, 2.5, -3.0])
        np.testing.assert_allclose(w.apply("new", z, input="logit"), expit(z), rtol=1e-13)
        np.testing.assert_allclose(w.apply("new-mc", ZZ, input="logits"),
                                   softmax(ZZ, axis=1), rtol=1e-12)
        p = np.array([0.0, 0.3, 1.0])
        np.testing.assert_allclose(w.apply("p", p, input="prob"), [1e-7, 0.3, 1 - 1e-7])
        np.testing.assert_allclose(w.apply("p2", p), [1e-7, 0.3, 1 - 1e-7])  # assumed probs
        with pytest.raises(CalibratorError, match="input="):
            w.apply("unknown", z)  # 2.5 is no probability: never clipped into one
        # the kind the model was declared with is remembered
        np.testing.assert_allclose(w.apply("new", z), expit(z), rtol=1e-13)
        # a declared kind that contradicts the document
        with pytest.raises(CalibratorError, match="logit"):
            w.apply("ctr", expit(z), input="prob")
        with pytest.raises(CalibratorError):
            w.apply("ctr", ZZ)  # a binary calibrator, multiclass scores
        with pytest.raises(CalibratorError):
            w.apply("ctr", z, input="score")
        # a segment without its own calibrator falls back to the model's
        np.testing.assert_allclose(w.apply("ctr", z, segment="country=US", input="logit"),
                                   expit(z / 1.5), rtol=1e-13)


def test_a_document_for_a_declared_kind_is_refused_when_it_does_not_fit(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    with CalibratorWatcher(tmp_path, background=False) as w:
        w.apply("ctr", Z, input="logit")  # serving says: ctr gives logits
        tree.write("ctr", {**doc("ctr", 1), "input": "logits"})
        w.refresh(force=True)
        assert w.get("ctr") is None and w.refusals() == {"ctr/__all__": 1}
        tree.write("ctr", doc("ctr", 2, 1.5))
        w.refresh(force=True)
        served(w, "ctr", 1.5)
        # and a segment's document must fit the model's other documents
        tree.write("ctr", {**doc("ctr", 1), "segment": "a=1", "input": "prob"}, segment="a=1")
        w.refresh(force=True)
        assert w.version("ctr", "a=1") == 2 and w.refusals() == {"ctr/__all__": 1,
                                                                 "ctr/a=1": 1}
