"""The shared memory block a rank writes and its monitor reads: the hot path.

The monitor creates an anonymous memory file (``memfd``) per rank and hands its file
descriptor to the rank over the control socket; both map it. The block is an array of
aligned 64-bit integers; the rank updates each with one plain store of a
``time.monotonic_ns()`` value (the same clock in every process on a host), so a
heartbeat or a section event never waits for, or fails because of, the monitor.

Slots:

- ``MAGIC``: :data:`SHM_MAGIC`, written by the monitor.
- ``LAST_HB_NS``: the last heartbeat, 0 before the first.
- ``OOS_SINCE_NS``: when the last section closed (or init), 0 while a section is open.
- ``SECTIONS_USED``: 1 once the rank has opened any section.
- ``WARMUP_STEPS``: how many ``step`` sections are warmup steps (the monitor writes the
  configured ``num_warmup_iterations``; the rank overwrites it with
  ``init_workload_monitoring(num_warmup_iters=...)``).
- ``STEPS_STARTED``: ``step`` sections opened so far, counted up to ``WARMUP_STEPS + 2``
  (incremented before the step's open time is stored): ``WARMUP_STEPS + 1`` says warmup
  is over, 2 (or 1 with ``step`` closed) that the first step ended.
- ``SECTION_BASE + i``: when section ``i`` (in the order the monitor sent) was opened,
  0 while closed.

Write order makes every torn read safe: opening the first section stores its open time
before clearing ``OOS_SINCE_NS``; closing the last stores ``OOS_SINCE_NS`` before
clearing the section; a reader that sees no open section and ``OOS_SINCE_NS == 0``
skips the out-of-section check for that round.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

__all__ = [
    "LAST_HB_NS",
    "MAGIC",
    "OOS_SINCE_NS",
    "SECTIONS_USED",
    "SECTION_BASE",
    "SHM_MAGIC",
    "SLOT_LAYOUT",
    "STEPS_STARTED",
    "WARMUP_STEPS",
    "RankSnapshot",
    "SharedBlock",
    "block_size",
]

MAGIC = 0
LAST_HB_NS = 1
OOS_SINCE_NS = 2
SECTIONS_USED = 3
WARMUP_STEPS = 4
STEPS_STARTED = 5
SECTION_BASE = 8
#: Slot indices by name, sent to the rank with its block so both sides agree on them.
SLOT_LAYOUT = {
    "last_hb_ns": LAST_HB_NS,
    "oos_since_ns": OOS_SINCE_NS,
    "sections_used": SECTIONS_USED,
    "warmup_steps": WARMUP_STEPS,
    "steps_started": STEPS_STARTED,
    "section_base": SECTION_BASE,
}
#: Largest warmup step count read from a block (the rank's own block; bounded anyway).
_MAX_WARMUP_STEPS = 1_000_000_000
SHM_MAGIC = 0x4E565258_46540001  # "NVRXFT" v1


def block_size(num_sections: int) -> int:
    """Bytes needed for ``num_sections`` sections, rounded up to whole pages."""
    raw = (SECTION_BASE + num_sections) * 8
    return max(mmap.PAGESIZE, -(-raw // mmap.PAGESIZE) * mmap.PAGESIZE)


@dataclasses.dataclass(frozen=True)
class RankSnapshot:
    """What the monitor read from a rank's block at one moment."""

    last_hb_ns: int
    oos_since_ns: int
    sections_used: bool
    open_sections: tuple[tuple[str, int], ...]
    warmup_steps: int = 0
    steps_started: int = 0


class SharedBlock:
    """One mapping of a rank's block; ``slots`` is an int64 view for plain stores."""

    def __init__(self, fd: int, num_sections: int) -> None:
        self._map = mmap.mmap(fd, block_size(num_sections))
        self.slots = memoryview(self._map).cast("q")
        self.num_sections = num_sections

    @classmethod
    def create(
        cls, num_sections: int, init_ns: int, warmup_steps: int = 0
    ) -> tuple[SharedBlock, int]:
        """A new block (and its file descriptor, to hand over) for a rank starting at init_ns."""
        fd = os.memfd_create("nvrx-ft-rank", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, block_size(num_sections))
            block = cls(fd, num_sections)
        except BaseException:
            os.close(fd)
            raise
        block.slots[OOS_SINCE_NS] = init_ns
        block.slots[WARMUP_STEPS] = warmup_steps
        block.slots[MAGIC] = SHM_MAGIC
        return block, fd

    def snapshot(self, sections: tuple[str, ...]) -> RankSnapshot:
        """Read the block (section slots last, see the module doc for why)."""
        s = self.slots
        oos = s[OOS_SINCE_NS]
        last_hb = s[LAST_HB_NS]
        used = bool(s[SECTIONS_USED])
        warmup = min(max(s[WARMUP_STEPS], 0), _MAX_WARMUP_STEPS)
        steps = min(max(s[STEPS_STARTED], 0), _MAX_WARMUP_STEPS + 2)
        values = [s[SECTION_BASE + i] for i in range(len(sections))]  # each slot read once
        opened = tuple((name, t) for name, t in zip(sections, values, strict=True) if t)
        return RankSnapshot(last_hb, oos, used or bool(opened), opened, warmup, steps)

    def close(self) -> None:
        """Unmap; the block lives on while the other side still maps it."""
        self.slots.release()
        self._map.close()
