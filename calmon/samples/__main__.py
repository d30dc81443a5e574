"""``python -m calmon.samples [DIR]``: write the sample files into DIR (./calmon-samples)."""

from __future__ import annotations

import sys

from calmon.samples import write


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m calmon.samples [DIR]   (default: ./calmon-samples)",
              file=sys.stderr)
        return 2
    directory = argv[0] if argv else "calmon-samples"
    for path in write(directory):
        print(path)
    print(f"next: calmon replay --predictions {directory}/predictions.jsonl --labels "
          f"{directory}/labels.jsonl -c {directory}/config.yaml --recalibrate",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
