"""calmon.io.start: the start rule's words, as the probe and the daemon's log say them."""

from __future__ import annotations

from calmon.io.start import GROUP, RESET, Start, listed, start_of


def test_each_partition_is_listed_up_to_the_cap_and_the_rest_summed() -> None:
    starts = [(p, Start(10 * p, GROUP, 5, 10 * p + 5)) for p in range(5)]
    lines = listed("preds", starts, "g", "earliest", 3)
    assert lines == [
        "preds/0: offset 0 (committed by group 'g'), 5 of 5 records ahead",
        "preds/1: offset 10 (committed by group 'g'), 5 of 15 records ahead",
        "preds/2: offset 20 (committed by group 'g'), 5 of 25 records ahead",
        "2 more partitions of 'preds': 10 of 80 records ahead",  # 35 + 45 held
    ]
    assert len(listed("preds", starts, "g", "earliest", 5)) == 5  # no tail when all fit


def test_a_committed_offset_the_topic_no_longer_holds_resets() -> None:
    st = start_of(checkpointed=False, stored=None, committed=3, begin=7, end=20,
                  reset="earliest")
    assert st == Start(7, RESET, 13, 13)
    assert listed("t", [(0, st)], "g", "earliest", 8) == [
        "t/0: offset 7 (kafka.auto_offset_reset: earliest), 13 of 13 records ahead"]
