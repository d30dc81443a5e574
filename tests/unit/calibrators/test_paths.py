"""One directory name per model/segment name: inside its parent, distinct, bounded."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from calmon.calibrators.paths import MAX_COMPONENT, dir_name
from calmon.calibrators.watcher import safe_name


def test_dot_names_separators_and_long_names() -> None:
    assert dir_name(".") not in (".", "..") and dir_name("..") not in (".", "..")
    assert "/" not in dir_name("a/b") and "\\\\" not in dir_name("a\\\\b")
    assert "\n" not in dir_name("a\nb")
    long = dir_name("x" * 1000)
    assert len(long.encode()) <= MAX_COMPONENT
    assert dir_name("x" * 1000) != dir_name("x" * 999)  # a hash of the full name
    assert dir_name("country=US,device=ios") == "country=US,device=ios"  # readable
    assert safe_name is dir_name  # the watcher reads what the publisher writes


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=300), st.text(min_size=0, max_size=300))
def test_every_name_is_one_component_and_distinct(a: str, b: str) -> None:
    for name in (a, b):
        d = dir_name(name)
        assert d not in ("", ".", "..") and "/" not in d and "\0" not in d
        assert len(d.encode("utf-8", "surrogatepass")) <= MAX_COMPONENT
        root = Path("/out")
        assert (root / d).parent == root
    if a != b:
        assert dir_name(a) != dir_name(b)
