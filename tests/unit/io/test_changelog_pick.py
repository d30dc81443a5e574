"""Which changelog records a restore takes (``calmon.io.changelog``, contract §8): the
chunks of the checkpoint named by the committed offset's metadata, or, where the broker
drops metadata (Tansu), the newest complete checkpoint written with the committed
offset; records of an aborted transaction, which Tansu serves under read_committed,
and older versions are skipped."""

from __future__ import annotations

from calmon.io.changelog import CHUNK_HEADER, CKPT_HEADER, POS_HEADER, _Found


def rec(name: str, index: int, count: int, offset: int, value: bytes
        ) -> tuple[dict[str, bytes], bytes]:
    return ({CKPT_HEADER: name.encode(), CHUNK_HEADER: f"{index}/{count}".encode(),
             POS_HEADER: str(offset).encode()}, value)


LOG = [rec("a:1", 0, 1, 10, b"old"),
       rec("a:2", 0, 2, 20, b"comm"), rec("a:2", 1, 2, 20, b"itted"),
       # an aborted transaction after it (a zombie's), served as if committed
       rec("z:7", 0, 1, 30, b"aborted")]


def read(found: _Found, log: list[tuple[dict[str, bytes], bytes]]) -> bytes | None:
    for heads, value in log:
        found.add(heads, value)
    return found.blob()


def test_by_name_takes_exactly_the_committed_checkpoint() -> None:
    assert read(_Found("a:2", "20"), LOG) == b"committed"
    assert read(_Found("a:1", "10"), LOG) == b"old"


def test_without_metadata_the_committed_offset_decides() -> None:
    assert read(_Found(None, "20"), LOG) == b"committed"
    assert read(_Found(None, "10"), LOG) == b"old"


def test_an_aborted_checkpoint_is_never_taken_for_the_committed_one() -> None:
    assert read(_Found("a:2", "20"), LOG) != b"aborted"
    assert read(_Found(None, "20"), LOG) != b"aborted"


def test_an_incomplete_checkpoint_is_none() -> None:
    cut = LOG[:2]  # a:2's second chunk missing
    assert read(_Found("a:2", "20"), cut) is None
    # without a name, the newest complete one written with that offset
    assert read(_Found(None, "20"), [*cut, rec("b:1", 0, 1, 20, b"later")]) == b"later"
