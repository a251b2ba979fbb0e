"""``python -m nvrx.launcher.goodput JOURNAL``: a job's goodput summary and timeline.

Apart from :mod:`.goodput` (the accounting) so that the trace writer
(:mod:`._trace`), which reads the accounting, is not imported by it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from nvrx.ft import write_file_atomically
from nvrx.launcher._trace import job_trace
from nvrx.launcher.goodput import account, records_of_run

__all__: list[str] = []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nvrx.launcher.goodput JOURNAL``: the job summary (and ``--trace`` timeline)."""
    parser = argparse.ArgumentParser(
        prog="python -m nvrx.launcher.goodput",
        description="Goodput and ETTR of a job from its ft_launcher journal.",
    )
    parser.add_argument("journal", help="the --ft-journal file (JSON lines)")
    parser.add_argument("--run-id", help="only the launchers of this run (a shared file)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="also write the job's timeline to FILE as Chrome trace-event JSON (Perfetto)",
    )
    args = parser.parse_args(argv)
    try:
        with open(args.journal, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        parser.error(f"journal {args.journal!r}: {exc.strerror}")
    records: list[Mapping[str, Any]] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(record, dict):
            records.append(record)
    if args.run_id is not None:
        records = records_of_run(records, args.run_id)
    summary = account(records)
    sys.stdout.write((summary.dumps() if args.json else summary.format()) + "\n")
    if args.trace is not None:
        trace = job_trace(records, job=args.run_id or pathlib.Path(args.journal).name)
        try:
            write_file_atomically(args.trace, json.dumps(trace), mode=0o600, durable=False)
        except OSError as exc:
            parser.error(f"--trace {args.trace!r}: {exc.strerror}")
    return 0
