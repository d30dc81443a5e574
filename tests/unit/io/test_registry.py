"""One registry factory: collectors describe their families, so a family two
collectors would both write is refused when the second registers, and what they
describe is what they collect."""

from __future__ import annotations

import pytest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from calmon import names
from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.snapshot import Refresher
from calmon.group_run import TaskCollector
from calmon.io.exporter import CalmonCollector, WindowCollector
from calmon.io.exposition import new_registry, standard_collectors
from calmon.recal.readmodel import RecalState
from tests.oracle import T0, L, P


def engine_fed() -> Engine:
    engine = Engine(from_dict({"segments": {"slices": [["country"]]}}))
    raws = []
    for i in range(50):
        raws += [P(f"{i}", T0 + i, prob=(i % 10) / 10, segment={"country": f"c{i % 2}"}),
                 L(f"{i}", i % 2)]
    assert engine.feed(raws) == []
    return engine


def recal_state() -> RecalState:
    key = ("m", names.ALL)
    return RecalState(calibrated_ece=[("m", names.ALL, "1h", 0.1)],
                      recalibrations={("m", names.ALL, "platt", "published"): 1},
                      versions={key: 2}, temperatures={key: 1.5},
                      drift={("m", names.ALL, "ece_above"): 1},
                      calibrated_samples=[("m", names.ALL, "1h", 10)],
                      drift_evidence={key: 0.5}, drift_change_ts={key: T0},
                      series=[key], methods=names.FIT_METHODS, owned_models=1)


def collectors(engine: Engine) -> tuple[WindowCollector, CalmonCollector]:
    snap = Refresher(engine).update(full=True)
    windows = WindowCollector(lambda: snap, engine.cfg)
    rest = CalmonCollector(engine, lambda: T0, recal_state, lag=lambda: {("p", 0): 3},
                           heartbeat=lambda: T0, dead_letters_failed=lambda: 1,
                           snapshot=lambda: snap, windows=False, statistics_age=lambda: 0.0)
    return windows, rest


def names_of(families: object) -> set[str]:
    return {f.name for f in families}  # type: ignore[attr-defined]


def test_what_a_collector_describes_is_what_it_collects() -> None:
    for c in collectors(engine_fed()):
        assert names_of(c.describe()) == names_of(c.collect())


def test_every_family_config_may_name_is_described() -> None:
    described = set()
    # the group mode's task families come from its own collector (calmon.group_run)
    for c in (*collectors(engine_fed()), TaskCollector(None)):  # type: ignore[arg-type]
        described |= {f.name.removeprefix("calmon_") for f in c.describe()}
    # counters are described without their _total, as prometheus-client keeps them
    known = {f.removesuffix("_total") for f in names.FAMILIES}
    assert known <= described, known - described


def test_the_daemons_collectors_register_once_each() -> None:
    windows, rest = collectors(engine_fed())
    registry = new_registry(windows, rest, *standard_collectors())
    got = {m.name for m in registry.collect()}
    assert {"calmon_ece", "calmon_predictions", "process_cpu_seconds", "python_info"} <= got


def test_a_family_written_twice_is_refused_at_registration() -> None:
    engine = engine_fed()
    windows, _ = collectors(engine)
    both = CalmonCollector(engine, snapshot=windows.snapshot)  # windows=True: ece again
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        new_registry(windows, both)

    class Another(Collector):
        def describe(self) -> list[CounterMetricFamily]:
            return [CounterMetricFamily("calmon_predictions", "again")]

        def collect(self) -> list[CounterMetricFamily]:
            return []

    registry = new_registry(CalmonCollector(engine))
    with pytest.raises(ValueError, match="calmon_predictions"):
        registry.register(Another())
