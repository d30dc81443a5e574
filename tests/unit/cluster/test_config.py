"""Scaled out with recalibration: the internal topics are required (contract §7)."""

from __future__ import annotations

import pytest

from calmon import config as config_mod
from calmon.errors import ConfigError


def test_two_instances_that_recalibrate_need_the_joined_and_calibrators_topics() -> None:
    with pytest.raises(ConfigError) as e:
        config_mod.from_dict({"kafka": {"instance": {"index": 0, "count": 2}}})
    text = str(e.value)
    assert "kafka.joined_topic: required with kafka.instance.count > 1" in text
    assert "kafka.calibrators_topic: required" in text
    # either is fine without recalibration, or with one instance
    config_mod.from_dict({"kafka": {"instance": {"index": 0, "count": 2}},
                          "recalibration": {"enabled": False}})
    config_mod.from_dict({"kafka": {"instance": {"index": 0, "count": 1}}})
    config_mod.from_dict({"kafka": {"instance": {"index": 1, "count": 2},
                                    "joined_topic": "calmon-joined",
                                    "calibrators_topic": "calmon-calibrators"}})
    with pytest.raises(ConfigError, match=r"kafka\.joined_topic: must be a topic of its own"):
        config_mod.from_dict({"kafka": {"joined_topic": "labels"}})
