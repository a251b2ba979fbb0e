"""The CRC-32 of the snapshot format, from the fastest implementation installed.

ISA-L's (the ``isal`` distribution, a dependency on Linux x86_64 and aarch64) folds
with carry-less multiplies and is 3-4x faster than zlib's on large buffers (100 MB:
8 ms against 28 ms here); both compute the same CRC-32 (zlib's polynomial, initial
value and final XOR), so a snapshot written with one verifies with the other. Both
release the GIL over large buffers. Without ``isal`` (another platform, or it failed
to import) zlib's is used and only speed differs.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

__all__: list[str] = []

Crc32 = Callable[..., int]


def _pick() -> tuple[Crc32, str]:
    try:
        from isal.isal_zlib import crc32 as isal_crc32
    except ImportError:
        return zlib.crc32, "zlib"
    return isal_crc32, "isal"


crc32, IMPLEMENTATION = _pick()
"""``crc32(data, value=0)``: zlib's CRC-32 of ``data`` (any buffer), continuing
``value``; and which implementation computes it ("isal" or "zlib")."""
