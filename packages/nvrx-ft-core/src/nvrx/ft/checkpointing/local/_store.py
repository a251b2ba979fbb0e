"""One rank's node-local store: two slot files per owner, reused in place.

``<node dir>/local<i>/<owner>.<slot>.snap`` with slot 0 or 1 holds what local rank i
keeps of owner's snapshots (its own, owner == its rank, and replicas of peers). A save
writes into the slot that does not hold the newest valid snapshot, so a writer killed
mid-save leaves the other slot valid. A slot's preamble is zeroed before its bytes
change and written last. Files are preallocated (``posix_fallocate``) so a full tmpfs
is an ``OSError`` at allocation, never a SIGBUS while copying into the mapping; the
mapping is kept and reused, so a steady state allocates no page again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import os
import pathlib
import re
import threading

from nvrx.ft.checkpointing.local import _format

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")
_SLOT_NAME = re.compile(r"(\d{1,9})\.([01])\.snap\Z")
_ZERO_PREAMBLE = b"\x00" * 64
_PAGE = 4096


def _with_headroom(size: int) -> int:
    """What a slot that must hold ``size`` bytes is allocated with: a little more, so
    that a snapshot a few bytes longer than the last (its manifest grows with the
    iteration's digits, the wall time's, a plain value's) reuses the mapping instead of
    allocating and faulting in the whole slot again."""
    want = size + max(4 * _PAGE, size >> 10)
    return -(-want // _PAGE) * _PAGE


class NoSpace(OSError):
    """The save does not fit (max_share or free space); the caller skips it."""


@dataclasses.dataclass
class Slot:
    """An open, mapped slot file."""

    path: pathlib.Path
    fd: int
    size: int
    mm: mmap.mmap

    def view(self) -> memoryview:
        return memoryview(self.mm)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()  # tensors over the mapping may still be alive: GC closes it
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclasses.dataclass(frozen=True)
class Held:
    """A valid snapshot found in the store."""

    owner: int
    iteration: int
    slot: int
    total_len: int
    wall: float
    path: pathlib.Path


class Store:
    """The slots of one local rank directory."""

    def __init__(self, directory: pathlib.Path, node_dir: pathlib.Path, max_share: float) -> None:
        self.dir = directory
        self.node_dir = node_dir
        self.max_share = max_share
        self._slots: dict[tuple[int, int], Slot] = {}
        self._newest: dict[int, tuple[int, int]] = {}  # owner -> (slot, iteration)
        self._lock = threading.Lock()
        self._scanned = False

    # -- layout ---------------------------------------------------------------------
    def path(self, owner: int, slot: int) -> pathlib.Path:
        return self.dir / f"{owner}.{slot}.snap"

    def ensure_dir(self) -> None:
        if not self.dir.is_dir():
            self.dir.mkdir(mode=0o700, parents=False, exist_ok=True)

    # -- which slot ---------------------------------------------------------------------
    def _scan_owner(self, owner: int) -> None:
        best: tuple[int, int] | None = None
        for slot in (0, 1):
            it = self._slot_iteration(self.path(owner, slot))
            if it is not None and (best is None or it > best[1]):
                best = (slot, it)
        if best is not None:
            self._newest[owner] = best

    @staticmethod
    def _slot_iteration(path: pathlib.Path) -> int | None:
        try:
            with path.open("rb") as f:
                head = f.read(_format.PREAMBLE_SIZE)
            return _format.parse_preamble(head).iteration
        except (OSError, _format.SnapshotError):
            return None

    def write_slot(self, owner: int) -> int:
        """The slot a new snapshot of ``owner`` goes to (not the newest valid one)."""
        with self._lock:
            if owner not in self._newest:
                self._scan_owner(owner)
            newest = self._newest.get(owner)
            return 0 if newest is None else 1 - newest[0]

    def committed(self, owner: int, slot: int, iteration: int) -> None:
        """Record that ``slot`` now holds ``owner``'s newest valid snapshot."""
        with self._lock:
            self._newest[owner] = (slot, iteration)

    def newest(self, owner: int) -> tuple[int, int] | None:
        with self._lock:
            if owner not in self._newest:
                self._scan_owner(owner)
            return self._newest.get(owner)

    # -- space and slots ------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes the snapshot files of this node directory occupy now."""
        total = 0
        with contextlib.suppress(OSError):
            for sub in os.scandir(self.node_dir):
                if not sub.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    for entry in os.scandir(sub.path):
                        if entry.name.endswith(".snap"):
                            with contextlib.suppress(OSError):
                                total += entry.stat(follow_symlinks=False).st_blocks * 512
        return total

    def check_space(self, grow: int) -> None:
        """NoSpace when growing the store by ``grow`` bytes would pass a limit."""
        if grow <= 0:
            return
        st = os.statvfs(self.dir)
        size = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        if grow > free:
            raise NoSpace(f"needs {grow} more bytes, the file system has {free} free")
        limit = self.max_share * size
        used = self.used_bytes()
        if used + grow > limit:
            raise NoSpace(
                f"would use {used + grow} bytes, over max_share {self.max_share} of "
                f"{size} bytes ({int(limit)})"
            )

    def open_slot(self, owner: int, slot: int, size: int) -> Slot:
        """The slot file mapped, at least ``size`` bytes, its preamble zeroed (invalid).

        A slot that must grow is allocated with headroom (:func:`_with_headroom`).
        NoSpace / OSError when it cannot be had; the slot is then left invalid or as it was.
        """
        key = (owner, slot)
        cur = self._slots.get(key)
        if cur is not None and cur.size >= size:
            cur.mm[: len(_ZERO_PREAMBLE)] = _ZERO_PREAMBLE
            self._forget_if_newest(owner, slot)
            return cur
        self.ensure_dir()
        path = self.path(owner, slot)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        have = 0
        try:
            have = os.fstat(fd).st_size
            if have >= _format.PREAMBLE_SIZE:
                os.pwrite(fd, _ZERO_PREAMBLE, 0)
            self._forget_if_newest(owner, slot)
            if have < size:
                size = _with_headroom(size)
                self.check_space(size - os.fstat(fd).st_blocks * 512)
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError:
                    os.ftruncate(fd, have)  # give back what a partial allocation took
                    raise
            new_size = max(size, have)
            mm = mmap.mmap(fd, new_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if have == 0:  # made just now: leave nothing behind
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        if cur is not None:
            cur.close()
        new = Slot(path, fd, new_size, mm)
        self._slots[key] = new
        return new

    def _forget_if_newest(self, owner: int, slot: int) -> None:
        with self._lock:
            if self._newest.get(owner, (-1, -1))[0] == slot:
                del self._newest[owner]

    def mapped(self, owner: int, slot: int) -> Slot | None:
        return self._slots.get((owner, slot))

    # -- reading --------------------------------------------------------------------------
    def held(self) -> list[Held]:
        """Every snapshot whose preamble is valid, newest first (contents not checked)."""
        out: list[Held] = []
        try:
            names = os.listdir(self.dir)
        except OSError:
            return out
        for name in names:
            m = _SLOT_NAME.match(name)
            if not m:
                continue
            path = self.dir / name
            try:
                with path.open("rb") as f:
                    pre = _format.parse_preamble(f.read(_format.PREAMBLE_SIZE))
                wall = 0.0
            except (OSError, _format.SnapshotError):
                continue
            if pre.owner != int(m.group(1)):
                continue
            out.append(Held(pre.owner, pre.iteration, int(m.group(2)), pre.total_len, wall, path))
        out.sort(key=lambda h: (-h.iteration, h.owner))
        return out

    def read_view(self, held: Held) -> memoryview:
        """A read/write mapping of a held snapshot (the file must not be rewritten meanwhile)."""
        slot = self._slots.get((held.owner, held.slot))
        if slot is not None and slot.size >= held.total_len:
            return slot.view()[: held.total_len]
        fd = os.open(held.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size < held.total_len:
                raise _format.SnapshotError(f"truncated: {size} bytes of {held.total_len}")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return memoryview(mm)[: held.total_len]

    def remove_owner(self, owner: int) -> None:
        """Delete both slots of ``owner`` (replicas no longer placed here)."""
        for slot in (0, 1):
            s = self._slots.pop((owner, slot), None)
            if s is not None:
                s.close()
            with contextlib.suppress(OSError):
                self.path(owner, slot).unlink()
        with self._lock:
            self._newest.pop(owner, None)

    def close(self) -> None:
        for s in self._slots.values():
            s.close()
        self._slots.clear()
