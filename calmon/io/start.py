"""Where a run starts reading each input partition, and how many records lie ahead.

The one rule (README "Where a run starts"), whichever library reads: a partition
starts at the next offset state.dir's checkpoint holds for it; with a checkpoint that
does not hold the partition, at ``kafka.auto_offset_reset``; with no checkpoint at
all, at the offset ``kafka.group_id`` committed, else at ``auto_offset_reset``. An
offset the topic no longer holds (retention) resets to ``auto_offset_reset`` too.
``check-config --probe`` shows it per partition, before a run; the daemon logs it.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT, GROUP, RESET = "checkpoint", "group", "auto_offset_reset"


@dataclass(frozen=True)
class Start:
    offset: int
    source: str  # CHECKPOINT, GROUP or RESET
    ahead: int  # records from offset to the end
    held: int  # records the partition holds (end - beginning)


def start_of(*, checkpointed: bool, stored: int | None, committed: int | None, begin: int,
             end: int, reset: str) -> Start:
    """The start of one partition. ``checkpointed``: a checkpoint was restored (then
    ``stored`` is its offset for the partition, or None); ``committed``: the group's
    committed offset, or None."""
    at, source = (stored if checkpointed else committed), (CHECKPOINT if checkpointed
                                                          else GROUP)
    if at is None or not begin <= at <= end:
        at, source = (begin if reset == "earliest" else end), RESET
    return Start(at, source, max(0, end - at), max(0, end - begin))


def describe(start: Start, group: str | None, reset: str) -> str:
    """``offset 120 (committed by group 'calmon'), 0 of 120 records ahead``."""
    why = {CHECKPOINT: "from state.dir's checkpoint",
           GROUP: f"committed by group {group!r}",
           RESET: f"kafka.auto_offset_reset: {reset}"}[start.source]
    return f"offset {start.offset} ({why}), {start.ahead} of {start.held} records ahead"


def listed(topic: str, starts: list[tuple[int, Start]], group: str | None, reset: str,
           shown: int) -> list[str]:
    """``topic/p: offset ...`` for the first ``shown`` partitions of ``topic``, then
    ``N more partitions of 'topic': A of H records ahead`` for the rest (a topic of
    hundreds of partitions must not flood a log line or the probe)."""
    out = [f"{topic}/{p}: {describe(st, group, reset)}" for p, st in starts[:shown]]
    rest = [st for _, st in starts[shown:]]
    if rest:
        out.append(f"{len(rest)} more partitions of {topic!r}: {sum(s.ahead for s in rest)} "
                   f"of {sum(s.held for s in rest)} records ahead")
    return out


def none_ahead(starts: list[Start], group: str | None) -> str | None:
    """Why a run on partitions holding records would read none of them (the newcomer's
    second run, from a group's committed offsets), or None when some lie ahead."""
    held = sum(st.held for st in starts)
    ahead = sum(st.ahead for st in starts)
    if held == 0 or ahead > 0:
        return None
    why = {CHECKPOINT: "state.dir's checkpoint is at the end",
           GROUP: f"group {group!r} committed the end (an earlier run with this group "
                  "read them)",
           RESET: "kafka.auto_offset_reset is latest"}
    return "; ".join(sorted({why[st.source] for st in starts}))


def as_status(starts: dict[tuple[str, int], Start]) -> dict[str, dict[str, int | str]]:
    """/status ``start``: ``topic/partition`` -> offset, source, ahead, held."""
    return {f"{t}/{p}": {"offset": st.offset, "source": st.source, "ahead": st.ahead,
                         "held": st.held} for (t, p), st in sorted(starts.items())}
