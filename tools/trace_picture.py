"""Draw a job trace (``python -m nvrx.launcher.goodput JOURNAL --trace FILE``) as an SVG.

The docs show the timeline people see in Perfetto; Perfetto's UI cannot run in the
docs build, so this draws the same tracks and slices as a static picture:

    python tools/trace_picture.py trace.json docs/guides/images/demo-trace.svg --title TITLE
"""

from __future__ import annotations

import argparse
import html
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

_WIDTH = 960
_LABEL_W = 110
_ROW_H = 34
_TOP = 30
_COLOURS = {
    "training": "#4caf50",
    "start-up": "#90a4ae",
    "detection": "#e53935",
    "stop": "#fb8c00",
    "rendezvous": "#fdd835",
    "spawn": "#8e24aa",
    "first step": "#1e88e5",
}


def _colour(name: str, track: str) -> str:
    if track == "cycles":
        return "#b0bec5"
    if track == "recomputed":
        return "#ef9a9a"
    return _COLOURS.get(name, "#cfd8dc")


def draw(trace: Mapping[str, Any], title: str | None = None) -> str:
    """The SVG text of ``trace``: one row per track, slices as bars, instants as marks.

    Instants' labels go on the first of a few lines where they do not overlap another.
    """
    events: Sequence[Mapping[str, Any]] = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    timed = sorted((e for e in events if e.get("ph") in ("X", "i")), key=lambda e: e["ts"])
    end_us = max((e["ts"] + e.get("dur", 0) for e in timed), default=1) or 1
    scale = (_WIDTH - _LABEL_W - 20) / end_us
    heights = {tid: _ROW_H * (3 if name == "events" else 1) for tid, name in tracks.items()}
    tops: dict[int, int] = {}
    y = _TOP
    for tid in sorted(tracks):
        tops[tid] = y
        y += heights[tid]
    height = y + 30
    job = title if title is not None else str(trace["otherData"]["job"])
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="8" y="18" font-size="13">{html.escape(job)} ({end_us / 1e6:.1f} s)</text>',
    ]
    for tid, top in tops.items():
        out.append(f'<text x="8" y="{top + 20}">{html.escape(tracks[tid])}</text>')
    label_ends: list[float] = []
    for e in timed:
        top = tops[e["tid"]]
        x = _LABEL_W + e["ts"] * scale
        name = html.escape(str(e["name"]))
        if e["ph"] == "X":
            w = max(1.0, e["dur"] * scale)
            fill = _colour(e["name"], tracks[e["tid"]])
            out.append(
                f'<rect x="{x:.1f}" y="{top + 4}" width="{w:.1f}" height="{_ROW_H - 8}" '
                f'fill="{fill}" stroke="white"><title>{name} '
                f"({e['dur'] / 1e6:.2f} s)</title></rect>"
            )
            if w > 6 * len(name):
                out.append(f'<text x="{x + 3:.1f}" y="{top + 21}">{name}</text>')
            continue
        line = next((i for i, end in enumerate(label_ends) if x > end), len(label_ends))
        if line == len(label_ends):
            label_ends.append(0.0)
        label_ends[line] = x + 6 + 6 * len(str(e["name"]))
        out.append(
            f'<path d="M{x:.1f},{top + 4} l5,8 l-10,0 z" fill="#b71c1c"><title>{name}</title>'
            f'</path><line x1="{x:.1f}" y1="{top + 12}" x2="{x:.1f}" y2="{top + 12 + 13 * line}" '
            f'stroke="#b71c1c" stroke-width="0.5"/><text x="{x + 4:.1f}" '
            f'y="{top + 22 + 13 * line}" fill="#b71c1c">{name}</text>'
        )
    axis_y = height - 14
    step = max(1, round(end_us / 1e6 / 10))
    for sec in range(0, int(end_us / 1e6) + 1, step):
        x = _LABEL_W + sec * 1e6 * scale
        out.append(f'<text x="{x:.1f}" y="{axis_y}" fill="#555">{sec} s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Read the trace, write the SVG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace", type=pathlib.Path)
    parser.add_argument("svg", type=pathlib.Path)
    parser.add_argument("--title", help="the picture's title (default: the trace's job)")
    args = parser.parse_args(argv)
    trace = json.loads(args.trace.read_text())
    args.svg.write_text(draw(trace, args.title), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
