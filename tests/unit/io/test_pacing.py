"""calmon.io.pacing: labels held while their partition's predictions lag behind them."""

from __future__ import annotations

from calmon.io.pacing import Pacer
from calmon.io.source import Chunk

P, L = "preds", "labels"


def chunk(topic: str, partition: int, first: int, stamps: list[int | None]) -> Chunk:
    n = len(stamps)
    offsets = list(range(first, first + n))
    return (topic, partition, [b"v%d" % o for o in offsets], list(stamps), offsets,
            [b"k%d" % o for o in offsets])


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def offsets_of(chunks: list[Chunk]) -> list[tuple[str, int, list[int]]]:
    return [(c[0], c[1], c[4]) for c in chunks]


def test_labels_wait_for_predictions_of_their_time_and_come_after_them() -> None:
    clock = Clock()
    pacer = Pacer(P, L, lambda p: True, clock=clock)
    # labels of t 100..104 arrive before any prediction of partition 0
    assert pacer.pace([chunk(L, 0, 0, [100, 101, 102, 103, 104])]) == []
    assert pacer.holding == 5
    # predictions up to t 102 come: the labels up to 102 follow them, in offset order
    out = pacer.pace([chunk(L, 0, 5, [105]), chunk(P, 0, 0, [99, 100, 102])])
    assert offsets_of(out) == [(P, 0, [0, 1, 2]), (L, 0, [0, 1, 2])]
    assert out[1][3] == [100, 101, 102] and out[1][2] == [b"v0", b"v1", b"v2"]
    assert pacer.holding == 3
    # another partition's predictions release nothing of partition 0
    assert offsets_of(pacer.pace([chunk(P, 1, 0, [200])])) == [(P, 1, [0])]
    out = pacer.pace([chunk(P, 0, 3, [110])])
    assert offsets_of(out) == [(P, 0, [3]), (L, 0, [3, 4, 5])]
    assert pacer.holding == 0


def test_a_prefix_only_so_offsets_stay_in_order() -> None:
    pacer = Pacer(P, L, lambda p: True, clock=Clock())
    pacer.pace([chunk(L, 0, 0, [10, 50, 20])])
    # the frontier (30) covers offsets 0 and 2 but not 1: only offset 0 may go
    assert offsets_of(pacer.pace([chunk(P, 0, 0, [30])]))[1:] == [(L, 0, [0])]


def test_nothing_waits_once_the_predictions_are_caught_up() -> None:
    lagging = {0: True}
    pacer = Pacer(P, L, lambda p: lagging[p], clock=Clock())
    assert pacer.pace([chunk(L, 0, 0, [100, None])]) == []
    lagging[0] = False  # the predictions partition has nothing more to fetch
    assert offsets_of(pacer.pace([])) == [(L, 0, [0, 1])]


def test_holding_is_bounded_in_time_and_in_records() -> None:
    clock = Clock()
    pacer = Pacer(P, L, lambda p: True, hold_s=2.0, hold_max=3, clock=clock)
    assert pacer.pace([chunk(L, 0, 0, [100])]) == []
    clock.t = 1.9
    assert pacer.pace([]) == []
    clock.t = 2.0
    assert offsets_of(pacer.pace([])) == [(L, 0, [0])]
    # more than hold_max records held: all go, predictions or not
    out = pacer.pace([chunk(L, 1, 0, [500, 501, 502, 503])])
    assert offsets_of(out) == [(L, 1, [0, 1, 2, 3])]
    assert pacer.holding == 0


def test_clear_forgets_what_is_held() -> None:
    pacer = Pacer(P, L, lambda p: True, clock=Clock())
    pacer.pace([chunk(L, 0, 0, [100]), chunk(P, 0, 0, [50])])
    assert pacer.holding == 1
    pacer.clear()
    assert pacer.holding == 0 and pacer.pace([chunk(P, 0, 1, [200])])[1:] == []


def test_nothing_is_held_where_partition_numbers_do_not_pair() -> None:
    pacer = Pacer(P, L, lambda p: True, clock=Clock())
    pacer.pairs = False  # the topics have different partition counts
    out = pacer.pace([chunk(L, 0, 0, [100]), chunk(P, 1, 0, [50])])
    assert offsets_of(out) == [(P, 1, [0]), (L, 0, [0])]  # predictions first, all of it
    assert pacer.holding == 0
