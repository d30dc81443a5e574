"""The calibrator document (contract section 6): exact round trips and strict loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import METHODS, Calibrator, fit, load
from calmon.errors import CalibratorError
from tests.unit.calibrators.conftest import binary_data, multiclass_data


def test_methods() -> None:
    assert METHODS == ("temperature", "platt", "isotonic", "histogram")


def scores_for(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if kind in ("logit", "prob"):
        z, y = binary_data(rng, 600)
        return (2 * z if kind == "logit" else expit(2 * z)), y
    z, y = multiclass_data(rng, 600, 4)
    return (2 * z if kind == "logits" else softmax(2 * z, axis=1)), y


@pytest.mark.parametrize("kind", ["prob", "logit", "probs", "logits"])
@pytest.mark.parametrize("method", ["temperature", "platt", "isotonic", "histogram"])
def test_round_trip_is_exact(
    rng: np.random.Generator, tmp_path: Path, method: str, kind: str
) -> None:
    scores, y = scores_for(kind, rng)
    cal = fit(method, scores, y, kind)
    assert isinstance(cal, Calibrator) and cal.method == method and cal.input == kind
    meta = {
        "model": "ctr-v3",
        "segment": "__all__",
        "version": np.int64(4),
        "fitted_at": "2026-11-30T12:00:00Z",
        "trigger": "ece_above",
        "fit": {"samples": 420, "holdout_before": {"ece": np.float64(0.071), "nll": 0.41}},
    }
    doc = cal.to_json(**meta)
    assert list(doc)[:3] == ["method", "params", "input"]
    assert doc["method"] == method and doc["input"] == kind
    text = json.dumps(doc, allow_nan=False)  # plain JSON: no numpy types, no NaN
    parsed = json.loads(text)
    assert parsed["version"] == 4 and parsed["fit"]["holdout_before"]["ece"] == 0.071

    fresh = rng.permutation(scores)  # apply on rows it did not see in that order
    expected = cal.apply(fresh)
    path = tmp_path / "v4.json"
    path.write_text(text, encoding="utf-8")
    for source in (parsed, str(path), path):
        again = load(source)
        assert type(again) is type(cal) and again.input == kind
        np.testing.assert_array_equal(again.apply(fresh), expected)
        assert again.params() == cal.params()
        assert again.meta["model"] == "ctr-v3" and again.meta["version"] == 4
        assert json.dumps(again.to_json(**again.meta)) == text


def test_contract_example_document() -> None:
    doc = {
        "model": "ctr-v3",
        "segment": "__all__",
        "version": 4,
        "method": "temperature",
        "params": {"temperature": 1.83},
        "input": "logit",
        "fitted_at": "2026-11-30T12:00:00Z",
        "trigger": "ece_above",
        "fit": {"samples": 14000, "holdout_samples": 6000},
    }
    cal = load(doc)
    z = np.array([-3.0, 0.0, 0.4, 12.0])
    np.testing.assert_allclose(cal.apply(z), expit(z / 1.83), rtol=1e-15)
    np.testing.assert_allclose(cal.apply(z.tolist()), expit(z / 1.83), rtol=1e-15)


META = {"model": "m", "segment": "__all__", "version": 1}


def test_hand_written_documents_apply_as_specified() -> None:
    platt = load({**META, "method": "platt", "params": {"a": 0.5, "b": -1}, "input": "prob"})
    p = np.array([0.0, 0.2, 0.9, 1.0])
    q = np.clip(p, 1e-15, 1 - 1e-15)
    expected = np.clip(expit(0.5 * np.log(q / (1 - q)) - 1), 1e-7, 1 - 1e-7)  # no certainties
    np.testing.assert_allclose(platt.apply(p), expected, rtol=1e-13)

    iso = load({**META, "method": "isotonic", "params": {"x": [0.2, 0.6], "y": [0.1, 0.5]},
                "input": "prob"})
    np.testing.assert_allclose(iso.apply([0.0, 0.2, 0.4, 0.6, 1.0]), [0.1, 0.1, 0.3, 0.5, 0.5])

    edges = [0.0, 0.5, 1.0]
    hist = load({**META, "method": "histogram",
                 "params": {"edges": edges, "values": [0.2, 0.7]}, "input": "probs"})
    out = hist.apply([[0.5, 0.3, 0.2], [0.1, 0.9, 0.0]])
    # the 0 of the second row is lifted to 1e-7 by the least mixing with uniform (1/3)
    w = 1e-7 / (1 / 3)
    second = (1 - w) * np.array([0.3, 0.7, 0.0]) + w / 3
    np.testing.assert_allclose(out, [[0.2, 0.8 * 0.6, 0.8 * 0.4], second], rtol=1e-14)
    assert out.min() >= 1e-7


def test_meta_may_not_override_the_calibrator() -> None:
    cal = load({**META, "method": "temperature", "params": {"temperature": 2.0},
                "input": "logit"})
    with pytest.raises(CalibratorError):
        cal.to_json(method="platt")
    assert cal.to_json(note=float("nan"))["note"] is None  # never NaN in a document


GOOD = {**META, "method": "temperature", "params": {"temperature": 2.0}, "input": "logit"}


@pytest.mark.parametrize(
    "doc",
    [
        {**GOOD, "method": "beta"},
        {**GOOD, "method": None},
        {k: v for k, v in GOOD.items() if k != "params"},
        {k: v for k, v in GOOD.items() if k != "input"},
        {k: v for k, v in GOOD.items() if k != "method"},
        {**GOOD, "input": "score"},
        {**GOOD, "params": [2.0]},
        {**GOOD, "params": {}},
        {**GOOD, "params": {"temperature": 2.0, "bias": "0.1"}},
        {**GOOD, "input": "logits", "params": {"temperature": 2.0, "bias": 0.1}},
        {**GOOD, "version": -1},
        {**GOOD, "version": "3"},
        {**GOOD, "version": True},
        {**GOOD, "params": {"temperature": 0.0}},
        {**GOOD, "params": {"temperature": -1.0}},
        {**GOOD, "params": {"temperature": float("nan")}},
        {**GOOD, "params": {"temperature": float("inf")}},
        {**GOOD, "params": {"temperature": True}},
        {**GOOD, "params": {"temperature": "2"}},
        {**META, "method": "platt", "params": {"a": 1.0}, "input": "logit"},
        {**META, "method": "isotonic", "params": {"x": [0.1, 0.1], "y": [0.2, 0.3]},
         "input": "prob"},
        {**META, "method": "isotonic", "params": {"x": [0.1, 0.2], "y": [0.3]}, "input": "prob"},
        {**META, "method": "isotonic", "params": {"x": [0.1, 0.2], "y": [0.3, 1.5]},
         "input": "prob"},
        {**META, "method": "isotonic", "params": {"x": [0.1, 0.2], "y": [0.3, 0.2]},
         "input": "prob"},
        {**META, "method": "isotonic", "params": {"x": [], "y": []}, "input": "prob"},
        {**META, "method": "histogram", "params": {"edges": [0, 1], "values": [0.1, 0.2]},
         "input": "prob"},
        {**META, "method": "histogram", "params": {"edges": [1, 0], "values": [0.1]},
         "input": "prob"},
        {**META, "method": "histogram", "params": {"edges": [0, 1], "values": ["x"]},
         "input": "prob"},
        [GOOD],
        "not a path that exists.json",
        42,
    ],
)
def test_invalid_documents_raise(doc: object) -> None:
    with pytest.raises(CalibratorError):
        load(doc)  # type: ignore[arg-type]


def test_invalid_files_raise(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CalibratorError):
        load(bad)
    with pytest.raises(CalibratorError):
        load(tmp_path / "missing.json")
    with pytest.raises(CalibratorError):
        load(tmp_path)  # a directory


def test_load_bounds_size_and_nesting(tmp_path) -> None:
    from calmon.calibrators.registry import MAX_BYTES

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(CalibratorError):
        load(deep)
    nested = {**GOOD, "extra": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}}
    with pytest.raises(CalibratorError):
        load(nested)
    big = tmp_path / "big.json"
    big.write_bytes(b'{"pad": "' + b"x" * (MAX_BYTES + 1) + b'"}')
    with pytest.raises(CalibratorError, match="over"):
        load(big)


def test_watcher_skips_a_bad_latest_json_and_keeps_the_good_ones(tmp_path, caplog) -> None:
    from calmon.calibrators import CalibratorWatcher

    good = tmp_path / "m" / "__all__"
    good.mkdir(parents=True)
    (good / "latest.json").write_text(json.dumps({**GOOD, "model": "m", "version": 2}))
    bad = tmp_path / "n" / "__all__"
    bad.mkdir(parents=True)
    (bad / "latest.json").write_text(json.dumps({**GOOD, "model": "n", "version": "two"}))
    w = CalibratorWatcher(tmp_path, min_interval=0.0, background=False)
    assert w.version("m") == 2
    assert w.get("n") is None  # refused, never raised
    assert w.apply("n", [0.25]).tolist() == [0.25]  # the model's own probability
    assert w.refusals() == {"n/__all__": 1}
    assert any("refusing calibrator" in r.message for r in caplog.records)


@pytest.mark.parametrize("kind", ["prob", "probs"])
def test_a_probability_calibrator_refuses_logits(rng: np.random.Generator, tmp_path: Path,
                                                 kind: str) -> None:
    """The newcomer's mistake: load() a calibrator fitted on probabilities and apply it to
    the model's logits. It used to clip them into [1e-7, 1 - 1e-7] silently; it refuses
    them as CalibratorWatcher does, and a declared kind must be the fitted one."""
    scores, y = scores_for(kind, rng)
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(fit("platt", scores, y, kind).to_json(
        model="m", segment="__all__", version=1)))
    cal = load(path)
    logits = np.log(np.clip(scores, 1e-9, 1)) * 3.0  # what a model server holds
    with pytest.raises(CalibratorError, match=r"not probabilities.*input="):
        cal.apply(logits)
    other = "logit" if kind == "prob" else "logits"
    with pytest.raises(CalibratorError, match=f"takes {kind!r} scores, not {other!r}"):
        cal.apply(scores, input=other)
    out = cal.apply(scores, input=kind)  # the fitted kind still applies, declared or not
    np.testing.assert_array_equal(out, cal.apply(scores))
