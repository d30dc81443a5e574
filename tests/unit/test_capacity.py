"""check-config's worst case: series counted from the limits, the memory compared with
limits.memory or the cgroup's limit (a warning on stderr, exit 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from calmon.capacity import cgroup_limit, series_per_model, worst_case
from calmon.config import from_dict

ROOT = Path(__file__).resolve().parents[2]


def test_series_per_model_and_per_instance() -> None:
    cfg = from_dict({"segments": {"slices": [["country"], ["device"], ["country", "device"]],
                                  "max_values": 3},
                     "limits": {"max_models": 10, "max_series": 100}})
    # __all__, 3 values + __other__ per key, and every pair of them
    assert series_per_model(cfg) == 1 + 4 + 4 + 16
    w = worst_case(cfg)
    assert w.series == 100 + 10 * 3  # max_series, plus an __other__ per model and slice
    small = worst_case(from_dict({"segments": {"slices": [["c"]], "max_values": 3},
                                  "limits": {"max_models": 2}}))
    assert small.series == 2 * 5


def test_memory_grows_with_every_limit() -> None:
    base = worst_case(from_dict({}))
    assert base.memory == sum(base.parts.values())
    for change in ({"limits": {"max_series": 10}}, {"limits": {"max_classes": 2}},
                   {"join": {"max_pending": 1000}}, {"limits": {"max_id_bytes": 16}},
                   {"recalibration": {"enabled": False}}, {"metrics": {"fine_bins": 15}}):
        assert worst_case(from_dict(change)).memory < base.memory, change


def test_scaled_out_an_instance_may_hold_every_models_owner_buffers() -> None:
    """Scaled out, the owner keeps a ring per series of each model it owns, beside its
    engine's: one instance may own them all, so the worst case counts them twice."""
    kafka = {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
             "calibrators_topic": "c"}
    one = worst_case(from_dict({}))
    out = worst_case(from_dict({"kafka": kafka}))
    assert out.parts["owner_buffers"] == one.parts["buffers"] > 0
    # held, and copied once more while a checkpoint is written
    assert out.memory == one.memory + 2 * one.parts["buffers"]
    assert out.parts["checkpoint write"] == one.parts["checkpoint write"] + one.parts["buffers"]
    assert out.checkpoint == one.checkpoint + one.parts["buffers"]
    assert "owner_buffers" not in worst_case(
        from_dict({"kafka": kafka, "recalibration": {"enabled": False}})).parts


def test_cgroup_limit(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    assert cgroup_limit((str(v2), str(v1))) is None
    v2.write_text("2147483648\n")
    assert cgroup_limit((str(v2), str(v1))) == 2**31
    v1.write_text("9223372036854771712\n")  # v1 without a limit
    assert cgroup_limit((str(tmp_path / "absent"), str(v1))) is None
    assert cgroup_limit((str(tmp_path / "absent"),)) is None


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    return subprocess.run([sys.executable, "-m", "calmon", "check-config", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_check_config_prints_the_worst_case_and_warns_over_budget(tmp_path: Path) -> None:
    over = _check(tmp_path, "limits: {memory: 1GiB}\n")
    assert over.returncode == 0
    assert "worst case of this config" in over.stderr and "limits.memory" in over.stderr
    assert yaml.safe_load(over.stdout)["limits"]["max_series"] == 5000  # still one document
    assert "#   series per model: 103 (1 + 51 + 51)" in over.stdout
    assert "#   series per instance: 5,200" in over.stdout
    under = _check(tmp_path, "limits: {memory: 1000GiB}\n")
    assert under.returncode == 0 and "worst case" not in under.stderr
    assert "#   memory: " in under.stdout and "#   checkpoint: " in under.stdout
