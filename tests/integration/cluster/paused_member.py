"""A group member in a process of its own, driven line by line over a pipe, so a test
can SIGSTOP it (every thread stops: the client library's heartbeats too, as in a
paused pod) and give it its next step before it resumes. Run as
``python -m tests.integration.cluster.paused_member CONFIG``; each command line
(``poll`` or ``checkpoint``) is answered with one JSON line."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import yaml

from calmon.config import from_dict
from calmon.group_run import GroupRun
from calmon.io.totals import ProcessTotals
from tests.fakes import DeadLetterLog


def main(path: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run = GroupRun(from_dict(yaml.safe_load(Path(path).read_text())), ProcessTotals(),
                   DeadLetterLog())  # type: ignore[arg-type]
    run.start()
    for line in sys.stdin:
        written = None
        if line.strip() == "checkpoint":
            written = run.checkpoint() is not None
        else:  # one turn of a member's loop, without its timed checkpoint
            run.tasks.feed(run.source.poll_chunks(250, 5000), time.time() + 3600, force=True,
                           skips=run.source.take_skips())
        engines = run.tasks.engines()
        print(json.dumps({"written": written, "tasks": sorted(run.tasks.tasks),
                          "running": run.tasks.counts()["running"],
                          "refused": run.tasks.fenced,
                          "joined": sum(e.status()["counters"]["joined"] for e in engines),
                          "pending": sum(e.join.pending for e in engines)}), flush=True)
    run.close()


if __name__ == "__main__":
    main(sys.argv[1])
