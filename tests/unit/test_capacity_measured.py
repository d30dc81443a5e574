"""check-config's worst case against the real structures (issue 35 item 13): each of the
join's bounded maps filled to ``join.max_pending`` in a fresh process, its RSS growth
per item within 20% of what check-config counts per item."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calmon.capacity import worst_case
from calmon.config import from_dict
from calmon.engine.records import LABEL_RAW_CAP
from tests.unit import join_child

ROOT = Path(__file__).resolve().parents[2]
N = 200_000
PART = {"pending": "pending", "labels": "waiting labels", "whole": "waiting labels",
        "joined": "joined ids"}


def test_the_label_bytes_kept_are_what_the_worst_case_counts() -> None:
    from calmon import capacity
    assert capacity.LABEL_RAW_CAP == LABEL_RAW_CAP == join_child.RAW_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("what", list(PART))
def test_a_full_map_costs_what_check_config_counts(what: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tests.unit.join_child", what, str(N)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT, check=True)
    got = json.loads(out.stdout)
    assert got["held"] == N  # the map is full, nothing else grew with it
    measured = got["grown"] / N
    counted = worst_case(from_dict(join_child.config(what, N))).parts[PART[what]] / N
    assert counted / 1.2 <= measured <= counted * 1.2, (what, measured, counted)
