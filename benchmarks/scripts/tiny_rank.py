"""A rank that imports nothing heavy (standard library only), for the node-scaling benchmark.

It appends one ``start`` line (rank, cycle, group rank, pid, wall-clock time) to
``<out>/events.jsonl`` as its "first step", then sleeps until ``<out>/stop`` exists and
exits 0, so every launcher ends its run cleanly and writes its store counts.
"""

import json
import os
import pathlib
import sys
import time


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    line = {
        "event": "start",
        "t": time.time(),
        "rank": int(os.environ["RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "cycle": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        "pid": os.getpid(),
    }
    fd = os.open(out / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
    while not (out / "stop").exists():
        time.sleep(0.05)


if __name__ == "__main__":
    main()
