"""check-config's worst case: series counted from the limits, the memory compared with
limits.memory or the cgroup's limit (a warning on stderr, exit 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from calmon.capacity import cgroup_limit, exported_series, series_per_model, worst_case
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


# group mode, a config small enough to add up by hand (README "Worst case"): one
# series (no slices), W = 1 window of 16 buckets, B = 10, F = 100, K = 2, I = 16, P = 1,000
SMALL_GROUP = {"kafka": {"instance": "group"},
               "recalibration": {"enabled": False, "window": "1h"},
               "limits": {"max_models": 1, "max_classes": 2, "max_id_bytes": 16},
               "segments": {"slices": []}, "join": {"max_pending": 1000},
               "metrics": {"windows": ["1h"], "bins": 10, "fine_bins": 100}}
BASE = 200 * 2**20
# a series: its buckets' int64 entries 16 x 8 x (3B + 3F + 3) and score histograms
# 32 x 8B (45,184), with dense slack 16 x 4096, 32 small buckets x 250 and 4096 more;
# its snapshot copy the same entries + 48 bucket keys x 16
SERIES = 45_184 + 16 * 4096 + 32 * 250 + 4096
SERIES_SNAP = 45_184 + 48 * 16
# pending (240 + 100 + 16K + I), waiting labels (190 + 50 + I), joined ids (180 + 80 + I)
JOIN = 1000 * (240 + 100 + 32 + 16) + 1000 * (190 + 50 + 16) + 1000 * (180 + 80 + 16)
# the estimation map (512 + 40F) and the pending fine-bin entries (P x 32), held and
# copied into the snapshot
ESTIMATES = 512 + 40 * 100 + 1000 * 32
PER_TASK = SERIES + JOIN + ESTIMATES + SERIES_SNAP + ESTIMATES
# a refresh sums the tasks' window vectors of the one series into one: 8 x (3B + 3F + 3)
SUMMED = 8 * 333


def test_group_mode_counts_an_engine_per_owned_partition() -> None:
    """The limits bind each task (one engine per owned partition): an instance owning
    12 partitions holds 12 engines' worst case, and a checkpoint the snapshot of each."""
    assert PER_TASK == 1_161_792
    cfg = from_dict(SMALL_GROUP)
    assert worst_case(cfg).memory == BASE + SUMMED + PER_TASK
    assert worst_case(cfg, 12).memory == BASE + SUMMED + 12 * PER_TASK
    static = from_dict({**SMALL_GROUP, "kafka": {}})
    assert worst_case(static, 12).memory == worst_case(static).memory == BASE + PER_TASK


def test_group_mode_exports_the_union_of_its_tasks_series() -> None:
    """Each task folds segments past limits.max_series on its own, so an instance's
    tasks may hold different ones: it exports (and sums) their union, up to every
    series the models and slices allow (3 models x (1 + 4 + 4) here)."""
    small = {"limits": {"max_models": 3, "max_series": 4}, "recalibration": {"enabled": False},
             "segments": {"slices": [["country"], ["device"]], "max_values": 3}}
    group = from_dict({**small, "kafka": {"instance": "group"}})
    assert worst_case(group).series == 4 + 3 * 2  # per task, as one instance
    assert worst_case(group).exported == worst_case(from_dict(small)).exported
    assert worst_case(group, 2).exported == exported_series(group, 2 * 10)
    assert worst_case(group, 5).exported == exported_series(group, 27)  # every one


def test_check_config_in_group_mode_says_how_many_tasks_fit_the_budget(
        tmp_path: Path) -> None:
    budget = BASE + SUMMED + 5 * PER_TASK + 1000  # the base and five tasks, not six
    out = _check(tmp_path, yaml.safe_dump({**SMALL_GROUP, "limits": {
        **SMALL_GROUP["limits"], "memory": budget}}))  # type: ignore[dict-item]
    assert out.returncode == 0, out.stderr
    assert "#   tasks an instance can own within the budget of " in out.stdout
    assert out.stdout.split("within the budget of ")[1].split("\n")[0].endswith(": 5")
    assert "worst case" not in out.stderr  # one task fits: the count is not known here
    assert "--probe counts them" in out.stdout
