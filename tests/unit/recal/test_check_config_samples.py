"""``calmon check-config`` warns when a refit could never start: min_samples larger
than the sample buffer (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import check_config


def _check(capsys: pytest.CaptureFixture[str], tmp_path: Path, recal: str) -> tuple[int, str]:
    rc, _, err = check_config(capsys, tmp_path, f"recalibration:\n{recal}")
    return rc, err


def test_min_samples_larger_than_the_buffer_is_warned_about(capsys, tmp_path: Path) -> None:
    rc, err = _check(capsys, tmp_path, "  min_samples: 6000\n  buffer: 5000\n")
    assert rc == 0
    assert "recalibration.min_samples (6000) cannot fit in recalibration.buffer (5000)" in err


def test_min_samples_that_fit_are_not_warned_about(capsys, tmp_path: Path) -> None:
    rc, err = _check(capsys, tmp_path, "  min_samples: 5000\n  buffer: 5000\n")
    assert rc == 0
    assert "min_samples" not in err
