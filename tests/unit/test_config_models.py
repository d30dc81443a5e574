"""The v5 keys of check-config: ``fields.decision``, ``models:`` (with ``"*"``
overlaid key by key), ``estimates:``; every error as ``path.to.key: ...`` with exit 2,
and the worst case counting the estimation maps and the new families."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calmon.capacity import worst_case
from calmon.config import from_dict
from tests.cli_helpers import check_config as check
from tests.cli_helpers import config_error


def test_a_models_entry_overlays_every_model_key_by_key(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, """
fields: {decision: action.taken}
models:
  "*": {threshold: 0.3}
  fraud-v2: {classes: [legit, fraud], threshold: 0.1}
  churn: {classes: [stays, leaves]}
estimates: {calibration: live, min_samples: 10, samples: 10}
""")
    assert rc == 0, err
    printed = yaml.safe_load(out)
    assert printed["fields"]["decision"] == "action.taken"
    assert printed["models"]["fraud-v2"] == {"classes": ["legit", "fraud"], "threshold": 0.1}
    assert printed["estimates"] == {"calibration": "live", "min_samples": 10, "samples": 10}
    cfg = from_dict(printed)
    assert cfg.model("fraud-v2").threshold == 0.1
    assert cfg.model("churn").threshold == 0.3  # from "*"
    assert cfg.model("churn").classes == ("stays", "leaves")
    assert cfg.model("other").classes is None and cfg.model("other").threshold == 0.3
    assert from_dict({}).model("any").threshold == 0.5  # the contract's default


@pytest.mark.parametrize(("text", "key", "says"), [
    ("models:\n  m: {classes: [only]}\n", "models.m.classes", "2 to limits.max_classes"),
    ("limits: {max_classes: 3}\nmodels:\n  m: {classes: [a, b, c, d]}\n",
     "models.m.classes", "(3)"),
    ("models:\n  m: {classes: [a, b, a]}\n", "models.m.classes[2]", "twice"),
    ("models:\n  m: {classes: [a, '']}\n", "models.m.classes[1]", "non-empty"),
    ("limits: {max_name_bytes: 4}\nmodels:\n  m: {classes: [a, abcde]}\n",
     "models.m.classes[1]", "max_name_bytes"),
    ("models:\n  m: {threshold: 0}\n", "models.m.threshold", "> 0"),
    ("models:\n  m: {threshold: 1.0}\n", "models.m.threshold", "< 1"),
    ("models:\n  '*': {threshold: 2}\n", "models.*.threshold", "< 1"),
    ("models:\n  m: {thresold: 0.2}\n", "models.m.thresold", "did you mean threshold"),
    ("models:\n  m: 0.2\n", "models.m", "mapping"),
    ("models: [a]\n", "models", "mapping"),
    ("estimates: {min_samples: 500, samples: 100}\n", "estimates.samples",
     "estimates.min_samples"),
    ("estimates: {calibration: reference}\n", "estimates.calibration", "labelled, live"),
    ("estimates: {min_samples: 0}\n", "estimates.min_samples", ">= 1"),
    ("estimates: {sample: 10}\n", "estimates.sample", "unknown key"),
    ("fields: {decision: ''}\n", "fields.decision", "non-empty"),
])
def test_each_error_names_its_key(capsys, tmp_path: Path, text: str, key: str,
                                  says: str) -> None:
    got_key, got_why = config_error(capsys, tmp_path, text)
    assert got_key == key and says in got_why, (got_key, got_why)


def test_a_model_name_no_record_could_carry(capsys, tmp_path: Path) -> None:
    rc, _, err = check(capsys, tmp_path, "limits: {max_name_bytes: 4}\nmodels:\n"
                                         "  abcdefgh: {threshold: 0.2}\n  '*': {}\n")
    assert rc == 2
    assert err.strip().splitlines() == [
        "models.abcdefgh: a model name over limits.max_name_bytes (4) is never admitted"]


def test_the_worst_case_counts_the_maps_and_the_new_families(capsys, tmp_path: Path) -> None:
    base = worst_case(from_dict({}))
    # every series holds a map of up to fine_bins points, and the pending predictions
    # their fine-bin counts: both grow with fine_bins and with the series
    assert base.parts["estimates"] > 0
    finer = worst_case(from_dict({"metrics": {"fine_bins": 4000}}))
    assert finer.parts["estimates"] > base.parts["estimates"]
    fewer = worst_case(from_dict({"limits": {"max_series": 10}}))
    assert fewer.parts["estimates"] < base.parts["estimates"]
    # exported series: every family for each model's __all__, the segment families
    # for the others, as metrics.export says
    one = from_dict({"limits": {"max_models": 1}, "segments": {"slices": []},
                     "recalibration": {"window": "1h"},
                     "metrics": {"windows": ["1h"], "bins": 2,
                                 "export": {"families": ["ece", "estimated_accuracy"]}}})
    assert worst_case(one).exported == 2 + 3 * 2  # two gauges of one window, bin counters
    # the v5 band and the two sums PromQL combines: four gauges a window
    band = ["estimated_accuracy_lower", "estimated_accuracy_upper", "estimated_correct",
            "estimated_correct_variance"]
    two = from_dict({"limits": {"max_models": 1}, "segments": {"slices": []},
                     "recalibration": {"window": "1h"},
                     "metrics": {"windows": ["1h", "24h"], "bins": 2,
                                 "export": {"families": band}}})
    assert worst_case(two).exported == 4 * 2 + 3 * 2
    rc, out, _ = check(capsys, tmp_path, "{}\n")
    assert rc == 0
    assert "exported series" in out and "estimates" in out
