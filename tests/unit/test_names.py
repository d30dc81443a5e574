"""The names several layers share are spelt once (calmon/names.py), and the layers
that write them agree with that spelling."""

from __future__ import annotations

import typing

from calmon import names
from calmon.calibrators import METHODS
from calmon.calibrators.scores import INPUTS
from calmon.calibrators.validate import RULES
from calmon.config import RecalibrationConfig
from calmon.engine.records import SCORE_KINDS
from calmon.io import exporter


def test_the_exporter_writes_the_families_config_knows() -> None:
    assert tuple(n.removeprefix("calmon_") for n, _, _ in exporter.ROW_GAUGES) == \
        names.ROW_FAMILIES
    assert tuple(n.removeprefix("calmon_") for n, _, _ in exporter.ESTIMATE_GAUGES) == \
        names.ESTIMATE_FAMILIES
    assert len(set(names.FAMILIES)) == len(names.FAMILIES)


def test_one_spelling_of_methods_and_kinds() -> None:
    method = typing.get_type_hints(RecalibrationConfig)["method"]
    assert typing.get_args(method) == (*names.FIT_METHODS, "auto")
    assert METHODS == names.FIT_METHODS == ("temperature", "platt", "isotonic", "histogram")
    # a fitted method without a params rule would have its documents' params unchecked
    assert sorted(RULES) == sorted(names.FIT_METHODS)
    assert SCORE_KINDS == INPUTS == ("prob", "logit", "probs", "logits")
