"""The client libraries every broker test of ``calmon.io`` runs on (``kafka.library``)."""

from __future__ import annotations

import pytest

LIBRARIES = ("kafka-python", "confluent")


@pytest.fixture(params=LIBRARIES)
def library(request: pytest.FixtureRequest) -> str:
    """Each value of ``kafka.library``; confluent is skipped where calmon[fast] is missing."""
    if request.param == "confluent":
        pytest.importorskip("confluent_kafka", reason="calmon[fast] (confluent-kafka) missing")
    return str(request.param)
