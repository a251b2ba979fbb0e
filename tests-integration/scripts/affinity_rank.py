"""A cycle_rank.py rank that first says which CPUs it may run on (the NUMA binding test).

Appends ``{"rank", "local_rank", "cycle", "cpus"}`` (``os.sched_getaffinity(0)``) as one
JSON line to ``<out>/affinity.jsonl``, then runs ``cycle_rank.py`` as ``__main__`` with
the same arguments.
"""

from __future__ import annotations

import json
import os
import pathlib
import runpy
import sys


def _out() -> pathlib.Path:
    return pathlib.Path(sys.argv[sys.argv.index("--out") + 1])


if __name__ == "__main__":
    said = {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "cycle": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    fd = os.open(_out() / "affinity.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (json.dumps(said) + "\n").encode())
    os.close(fd)
    runpy.run_path(str(pathlib.Path(__file__).with_name("cycle_rank.py")), run_name="__main__")
