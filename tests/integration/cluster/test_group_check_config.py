"""check-config --probe in group mode (contract §3, §8): the predictions topic's
partition count bounds the tasks an instance may own (all of them, the other members
down), so the worst case printed and held against the budget is that of an instance
owning every partition."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.unit.test_capacity import BASE, PER_TASK, ROOT, SMALL_GROUP, SUMMED

pytestmark = pytest.mark.integration


def test_probe_counts_every_partition_an_instance_may_own(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds, labels = kafka_topics(count=2, partitions=12)
    budget = BASE + SUMMED + 5 * PER_TASK + 1000
    cfg = {**SMALL_GROUP, "kafka": {**SMALL_GROUP["kafka"], "bootstrap_servers": kafka_bootstrap,
                                    "predictions_topic": preds, "labels_topic": labels},
           "limits": {**SMALL_GROUP["limits"], "memory": budget}}  # type: ignore[dict-item]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "calmon", "check-config", "-c", str(path),
                          "--probe"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert yaml.safe_load(out.stdout)["kafka"]["instance"] == "group"  # one document
    worst = f"{(BASE + SUMMED + 12 * PER_TASK) / 2**20:,.1f} MiB"
    assert (f"#   an instance owning all 12 partitions (the other members down): {worst}"
            in out.stdout), out.stdout
    assert f"the worst case of this config, {worst}, exceeds the memory budget" in out.stderr
