"""Contract v3 §6, documents serving code can trust: what load() refuses (always with
CalibratorError), and what apply() returns (never a certainty)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

from calmon.calibrators import Calibrator, fit, load
from calmon.errors import CalibratorError
from tests.unit.calibrators.conftest import binary_data

META = {"model": "ctr", "segment": "__all__", "version": 3}
TEMP = {**META, "method": "temperature", "params": {"temperature": 2.0}, "input": "logit"}
ISO = {**META, "method": "isotonic", "params": {"x": [0.1, 0.5, 0.9], "y": [0.2, 0.4, 0.7]},
       "input": "prob"}


def with_params(doc: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {**doc, "params": {**doc["params"], **params}}


# Every broken or forged document the issue lists, and their relatives.
BROKEN = {
    "401-digit integer parameter": with_params(TEMP, temperature=10**400),
    "401-digit integer in the fit summary": {**TEMP, "fit": {"samples": 10**400}},
    "version 10^30": {**TEMP, "version": 10**30},
    "negative version": {**TEMP, "version": -1},
    "float version": {**TEMP, "version": 3.0},
    "T = 1e-300": with_params(TEMP, temperature=1e-300),
    "T below 0.01": with_params(TEMP, temperature=0.0099),
    "T above 100": with_params(TEMP, temperature=100.5),
    "binary bias over 50": with_params(TEMP, bias=50.5),
    "binary bias below -50": with_params(TEMP, bias=-51),
    "class biases on a binary input": with_params(TEMP, bias=[0.1, -0.1]),
    "one class bias over 50": {**with_params(TEMP, bias=[0.0, 60.0, 0.0]), "input": "logits"},
    "a scalar bias on a multiclass input": {**with_params(TEMP, bias=0.5), "input": "logits"},
    "inverted Platt (a = -5)": {**META, "method": "platt", "params": {"a": -5.0, "b": 0.0},
                                "input": "logit"},
    "flat Platt (a = 0)": {**META, "method": "platt", "params": {"a": 0, "b": 0.0},
                           "input": "logit"},
    "Platt intercept over 50": {**META, "method": "platt", "params": {"a": 1.0, "b": 80.0},
                                "input": "logit"},
    "isotonic outputs of exactly 0 and 1": with_params(ISO, y=[0.0, 0.5, 1.0]),
    "isotonic output of exactly 1": with_params(ISO, y=[0.2, 0.5, 1]),
    "non-monotone isotonic map": with_params(ISO, y=[0.2, 0.6, 0.4]),
    "isotonic x not increasing": with_params(ISO, x=[0.1, 0.9, 0.5]),
    "histogram output of exactly 0": {**META, "method": "histogram", "input": "prob",
                                      "params": {"edges": [0, 0.5, 1], "values": [0, 0.6]}},
    "over 10,000 isotonic knots": with_params(
        ISO, x=[i / 20000 for i in range(10_001)], y=[0.5] * 10_001),
    "over 10,000 histogram bins": {**META, "method": "histogram", "input": "prob", "params": {
        "edges": [i / 10_001 for i in range(10_002)], "values": [0.5] * 10_001}},
    "no model": {k: v for k, v in TEMP.items() if k != "model"},
    "no segment": {k: v for k, v in TEMP.items() if k != "segment"},
    "no version": {k: v for k, v in TEMP.items() if k != "version"},
    "model not a string": {**TEMP, "model": 7},
    "empty model": {**TEMP, "model": ""},
    "NaN parameter": with_params(TEMP, temperature=float("nan")),
    "NaN in meta": {**TEMP, "note": float("inf")},
    "numbers as strings": with_params(TEMP, temperature="2.0"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_load_refuses_broken_documents_with_calibrator_error(name: str, tmp_path: Path) -> None:
    doc = BROKEN[name]
    with pytest.raises(CalibratorError):
        load(doc)
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(doc), encoding="utf-8")  # NaN is written as NaN: refused too
    with pytest.raises(CalibratorError):
        load(path)


def test_the_ranges_ends_and_a_large_valid_map_load() -> None:
    for t in (0.01, 100, 1):
        assert load(with_params(TEMP, temperature=t)).params()["temperature"] == t
    # the ends hold to rounding (1 / (1 / 100) in floating point), not beyond
    assert load(with_params(TEMP, temperature=100.00000000000004)).params()["temperature"] > 100
    with pytest.raises(CalibratorError):
        load(with_params(TEMP, temperature=100.001))
    # an uninformative model's fit runs to the end of the range and still loads
    flat = fit("temperature", np.zeros(8), [0, 1, 1, 1, 0, 1, 1, 1], "logit")
    assert flat.temperature == 100.0 and load(flat.to_json(**META)).params() == flat.params()
    for b in (-50, 50.0):
        assert load(with_params(TEMP, bias=b)).params()["bias"] == b
    platt = load({**META, "method": "platt", "params": {"a": 1e-9, "b": -50},
                  "input": "logit"})
    assert platt.params() == {"a": 1e-9, "b": -50.0}
    n = 10_000
    x = [i / n for i in range(n)]
    y = [0.01 + 0.98 * i / n for i in range(n)]
    assert len(load(with_params(ISO, x=x, y=y)).params()["x"]) == n


def test_an_input_that_does_not_fit_the_model_is_refused() -> None:
    """``input: probs`` on a binary model would make every apply() raise."""
    doc = {**TEMP, "input": "probs"}
    load(doc)  # a valid document for a multiclass model
    with pytest.raises(CalibratorError, match="does not fit"):
        load(doc, input="logit")
    assert load(TEMP, input="logit").input == "logit"


def test_files_over_1_mib_and_json_tricks_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"  # a 14 MB isotonic document
    n = 600_000
    doc = with_params(ISO, x=[i / n for i in range(n)], y=[0.01 + 0.98 * i / n for i in range(n)])
    big.write_text(json.dumps(doc), encoding="utf-8")
    assert big.stat().st_size > 14_000_000
    with pytest.raises(CalibratorError, match="over"):
        load(big)
    with pytest.raises(CalibratorError):
        load(doc)  # the same as an object
    padded = {**TEMP, "pad": "x" * (1 << 20)}  # small map, large document
    with pytest.raises(CalibratorError, match="over"):
        load(padded)
    for text in ('{"model": "a", "model": "b"}',  # duplicate keys
                 json.dumps(TEMP)[:-1] + ', "x": 1e400}',  # a float that overflows
                 json.dumps(TEMP)[:-1] + ', "x": NaN}',
                 json.dumps(TEMP)[:-1] + ', "x": ' + "9" * 5000 + "}"):  # past int limits
        path = tmp_path / "trick.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(CalibratorError):
            load(path)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(["model", "segment", "version", "method", "input", "params",
                            "temperature", "bias", "fit"]), value=JSON)
def test_load_raises_nothing_but_calibrator_error(key: str, value: Any) -> None:
    """Any value in any place: a calibrator, or CalibratorError (never OverflowError,
    TypeError, ...)."""
    doc = (with_params(TEMP, **{key: value}) if key in ("temperature", "bias")
           else {**TEMP, key: value})
    try:
        cal = load(doc)
    except CalibratorError:
        return
    out = cal.apply(np.array([-1e9, -3.0, 0.0, 2.0, 1e9]))
    assert np.all((out >= 1e-7) & (out <= 1 - 1e-7))


@pytest.mark.parametrize("method", ["temperature", "platt", "isotonic", "histogram"])
def test_apply_never_returns_a_certainty(method: str, rng: np.random.Generator) -> None:
    z, y = binary_data(rng, 2000, scale=6.0)
    cal = fit(method, z, y, "logit")
    out = cal.apply(np.array([-1e6, -80.0, 0.0, 80.0, 1e6]))
    assert out.min() >= 1e-7 and out.max() <= 1 - 1e-7
    doc = cal.to_json(**META)
    assert load(doc).params() == cal.params()  # every fit is a document load() accepts

    zz = rng.normal(0, 30, (500, 6))
    yy = rng.integers(0, 6, 500)
    cal = fit(method, zz, yy, "logits")
    out = cal.apply(zz)
    assert out.min() >= 1e-7 and out.max() <= 1 - 1e-7
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)


def test_a_steep_temperature_is_clipped_as_the_contract_says() -> None:
    cal = load(with_params(TEMP, temperature=0.01))
    z = np.array([-1.0, -0.01, 0.0, 0.05, 1.0])
    np.testing.assert_allclose(cal.apply(z), np.clip(expit(z / 0.01), 1e-7, 1 - 1e-7),
                               rtol=1e-12)


def test_fits_stay_within_what_load_accepts(rng: np.random.Generator) -> None:
    """Separable data, backward scores, too many distinct scores: the fitted documents
    still load (slopes, intercepts and knot counts within the limits)."""
    x = np.linspace(-3, 3, 40)
    sep = (x > 0).astype(int)
    for method in ("platt", "isotonic", "histogram"):
        load(fit(method, x, sep, "logit").to_json(**META))
        load(fit(method, x, 1 - sep, "logit").to_json(**META))
    z = rng.normal(0, 1, 60_000)
    yy = (rng.random(60_000) < expit(z)).astype(int)
    iso = fit("isotonic", expit(z), yy, "prob")
    assert len(iso.params()["x"]) <= 10_000
    load(iso.to_json(**META))
    with pytest.raises(CalibratorError):
        fit("histogram", z, yy, "logit", bins=10_001)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_are_a_calibrator_or_calibrator_error(data: bytes) -> None:
    from calmon.calibrators.registry import parse_document

    try:
        out = load(parse_document(data))
    except CalibratorError:
        return  # the only exception allowed
    assert isinstance(out, Calibrator)
