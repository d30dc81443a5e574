"""An idle run is said: no record for a minute while records lie ahead."""

from __future__ import annotations

import logging

import pytest

from calmon.io.reading import IDLE_AFTER_S, ReadWatch


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_records_ahead_and_none_read_for_a_minute_is_warned_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, lag = Clock(), {("p", 0): 0}
    watch = ReadWatch(lambda: lag, clock=clock)
    with caplog.at_level(logging.WARNING, logger="calmon.io.reading"):
        clock.t += IDLE_AFTER_S + 1
        watch.check()  # idle, but nothing ahead: a quiet topic is no trouble
        assert not caplog.records and watch.status()["idle"] is False
        lag[("p", 0)] = 40
        clock.t += 6
        watch.check()
        assert len(caplog.records) == 1 and "40 records ahead" in caplog.records[0].message
        assert watch.status() == {"idle_seconds": IDLE_AFTER_S + 7, "ahead": 40, "idle": True}
        clock.t += 30
        watch.check()  # not again within the minute
        assert len(caplog.records) == 1
        watch.saw(5)  # reading again: no longer idle
        assert watch.status() == {"idle_seconds": 0.0, "ahead": 0, "idle": False}
        clock.t += 10
        watch.check()
        assert len(caplog.records) == 1
