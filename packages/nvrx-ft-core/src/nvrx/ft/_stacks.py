"""Summarise a rank's faulthandler dump: blocked inside a collective, or where else.

The monitor asks a hung rank for a dump with ``stack_dump_signal`` (faulthandler, in
C, so it works while the rank is stuck in C code). Where the rank's stderr is a
regular file, the monitor reads the dump back from it (:func:`read_appended`) and
summarises it here, so the launcher can tell the rank that hung from the ranks that
wait for it. Pure functions on text; nothing here touches the rank.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sysconfig
from typing import Any

__all__ = [
    "COLLECTIVES",
    "MAX_DUMP_BYTES",
    "StackSummary",
    "dump_offset",
    "read_appended",
    "summarize_dump",
]

#: torch.distributed functions that block until every rank of the group takes part.
COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "monitored_barrier",
        "recv",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "wait",
        # DDP's gradient all-reduce runs inside the autograd engine (C++): a rank waiting
        # for its peers' gradients shows the engine as its innermost Python frame.
        "backward",
    }
)
#: torch.autograd frames that, innermost, mean the rank is waiting in the autograd engine.
_AUTOGRAD_WAIT = frozenset({"_engine_run_backward", "backward", "grad", "run_backward"})
_TORCH_AUTOGRAD = re.compile(r"[/\\]torch[/\\]autograd[/\\]")
#: Most bytes of a dump the monitor reads back (faulthandler prints at most 100 frames
#: per thread; more than this is other output).
MAX_DUMP_BYTES = 256 * 1024
_MAX_TEXT = 200  # characters kept of a file name or function name
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+) \(most recent call first\):"
)
_TORCH_DIST = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


@dataclasses.dataclass(frozen=True)
class StackSummary:
    """Where a rank's training thread was when it was dumped.

    ``collective`` names the torch.distributed call it was blocked in (None: elsewhere);
    ``location`` is ``file:line`` of its innermost user frame (outside the standard
    library and installed packages), or of its innermost frame when it has none.
    """

    collective: str | None
    location: str
    function: str

    @property
    def in_collective(self) -> bool:
        """True when the rank was blocked inside a collective."""
        return self.collective is not None

    def describe(self) -> str:
        """A short phrase: 'blocked in all_reduce' or 'stack in train.py:53'."""
        if self.collective is not None:
            return f"blocked in {self.collective}"
        return f"stack in {self.location}"

    def to_json(self) -> dict[str, Any]:
        """The event form (see :func:`from_json`)."""
        return {"collective": self.collective, "location": self.location, "function": self.function}

    @classmethod
    def from_json(cls, value: object) -> StackSummary:
        """Parse the event form; ValueError says what is wrong."""
        if not isinstance(value, dict) or set(value) != {"collective", "location", "function"}:
            raise ValueError(f"stack {value!r} is not {{collective, location, function}}")
        coll, loc, func = value["collective"], value["location"], value["function"]
        if coll is not None and (not isinstance(coll, str) or coll not in COLLECTIVES):
            raise ValueError(f"stack collective {coll!r} is not a known collective")
        for name, text in (("location", loc), ("function", func)):
            if not isinstance(text, str) or len(text) > 2 * _MAX_TEXT:
                raise ValueError(f"stack {name} {text!r} is not a short string")
        return cls(coll, loc, func)


@dataclasses.dataclass(frozen=True)
class _Frame:
    file: str
    line: int
    func: str


def _threads(text: str) -> list[tuple[bool, list[_Frame]]]:
    """(is_current, frames innermost first) for every thread of the last dump in text."""
    threads: list[tuple[bool, list[_Frame]]] = []
    frames: list[_Frame] | None = None
    ids: set[str] = set()
    for raw in text.splitlines():
        head = _THREAD.match(raw)
        if head is not None:
            if head["id"] in ids:  # a thread seen again: a later dump, keep only that one
                threads, ids = [], set()
            ids.add(head["id"])
            frames = []
            threads.append((head["current"] == "Current thread", frames))
            continue
        frame = _FRAME.match(raw)
        if frame is not None and frames is not None:
            frames.append(
                _Frame(frame["file"][-_MAX_TEXT:], int(frame["line"]), frame["func"][:_MAX_TEXT])
            )
        elif frames is not None and raw.strip() and raw.strip() != "...":
            frames = None  # other output ends this thread's frames
    return [t for t in threads if t[1]]


def _training_thread(threads: list[tuple[bool, list[_Frame]]]) -> list[_Frame]:
    """The main thread: not started by threading (bottom frame not threading's bootstrap)."""
    main = [f for _, f in threads if not f[-1].file.endswith("threading.py")]
    if len(main) == 1:
        return main[0]
    current = [f for cur, f in threads if cur]
    return current[0] if current else threads[0][1]


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.join(d, "") for d in sorted(dirs))


def summarize_dump(text: str) -> StackSummary | None:
    """The training thread's summary from faulthandler output; None without a dump."""
    threads = _threads(text)
    if not threads:
        return None
    frames = _training_thread(threads)
    collective = next(
        (f.func for f in frames if f.func in COLLECTIVES and _TORCH_DIST.search(f.file)), None
    )
    if (
        collective is None
        and frames[0].func in _AUTOGRAD_WAIT
        and _TORCH_AUTOGRAD.search(frames[0].file)
    ):
        collective = "backward"
    libs = _library_dirs()
    user = next(
        (f for f in frames if not f.file.startswith(libs) and "site-packages" not in f.file),
        frames[0],
    )
    return StackSummary(collective, f"{os.path.basename(user.file)}:{user.line}", user.func)


def dump_offset(pid: int) -> int | None:
    """Size of the rank's stderr when it is a regular file (the dump lands after it)."""
    try:
        st = os.stat(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_appended(pid: int, offset: int) -> str:
    """What the rank wrote to its stderr file after ``offset`` (bounded, never blocks)."""
    try:
        fd = os.open(f"/proc/{pid}/fd/2", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = os.pread(fd, MAX_DUMP_BYTES, offset)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")
