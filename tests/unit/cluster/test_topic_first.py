"""Scaled out, ``output_dir`` is a copy of the calibrators topic (contract §7): the
owner's registry writes a version locally only once the topic took it, so a publish the
broker refused (a fenced former owner) leaves no phantom version behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmon.recal.registry import Registry


def doc(temperature: float) -> dict:
    return {"model": "ctr", "segment": "__all__", "method": "temperature",
            "input": "logit", "params": {"temperature": temperature, "bias": 0.0}}


def test_a_refused_publish_writes_nothing_and_an_accepted_one_is_copied(
        tmp_path: Path) -> None:
    sent: list[tuple[str, bytes]] = []
    refuse = [True]

    def topic(model: str, segment: str, _doc: dict, data: bytes) -> bool:
        if refuse[0]:
            raise RuntimeError("ProducerFencedError")  # what a fenced commit raises
        sent.append((f"{model}/{segment}", data))
        return True

    reg = Registry(tmp_path, topic, topic_first=True)
    with pytest.raises(RuntimeError):
        reg.publish(doc(2.0))
    assert reg.versions("ctr", "__all__") == [] and reg.live("ctr", "__all__") is None
    refuse[0] = False
    out = reg.publish(doc(1.5))
    assert out["version"] == 1 and [k for k, _ in sent] == ["ctr/__all__"]
    d = reg.dir_of("ctr", "__all__")
    # the local copy is byte for byte what the topic holds
    assert (d / "v1.json").read_bytes() == sent[0][1] == (d / "latest.json").read_bytes()
    assert json.loads(sent[0][1])["params"]["temperature"] == 1.5
    assert reg.publish(doc(1.2))["version"] == 2
