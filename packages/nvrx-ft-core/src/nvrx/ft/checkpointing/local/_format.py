"""The snapshot file: a preamble, raw tensor bytes, a JSON manifest. No pickle anywhere.

Layout of one snapshot (a slot file, or the same bytes sent to a peer)::

    [0, 4096)                 preamble (fixed struct + its own CRC32), written LAST
    [4096, 4096 + data_len)   every tensor's raw bytes, each at a 64-byte aligned offset
    [manifest_off, +len)      UTF-8 JSON: format version, job, owner, world size,
                              iteration, wall time, the state tree and, per tensor,
                              dtype, shape, offset, nbytes, CRC32, device type

A reader trusts nothing before the preamble's CRC, the manifest's CRC, the format
version, the job identity and (when asked) every tensor's CRC check out; anything
else is :class:`SnapshotError`, and the caller skips that snapshot with one warning.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import struct
from typing import Any

import torch

from nvrx.ft.checkpointing.local._crc import crc32

__all__: list[str] = []

FORMAT_VERSION = 1
MAGIC = b"NVRXLCK\x00"
PREAMBLE_SIZE = 4096
ALIGN = 64
# magic, version, iteration, owner, world_size, data_len, manifest_off, manifest_len,
# manifest_crc, total_len; then the CRC32 of those bytes.
_PRE = struct.Struct("<8sIqqqQQQIQ")
_CRC = struct.Struct("<I")
_MAX_MANIFEST = 256 * 1024 * 1024


class SnapshotError(ValueError):
    """A snapshot that must not be loaded (damaged, another job's, another version)."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are and what they are."""

    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the start of the snapshot
    nbytes: int
    crc: int
    device: str  # device type the tensor was on ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Preamble:
    """The fixed header: enough to find and check the manifest."""

    iteration: int
    owner: int
    world_size: int
    data_len: int
    manifest_off: int
    manifest_len: int
    manifest_crc: int
    total_len: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a snapshot holds, parsed and checked."""

    job: str
    owner: int
    world_size: int
    iteration: int
    wall: float
    tree: Any
    tensors: tuple[TensorEntry, ...]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The dtype named; SnapshotError when torch has none of that name."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SnapshotError(f"unknown dtype {name!r}")
    return dtype


def align(n: int) -> int:
    """``n`` rounded up to the tensor alignment."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Each tensor's offset from the snapshot start, and the end of the data region."""
    offsets: list[int] = []
    pos = PREAMBLE_SIZE
    for t in tensors:
        offsets.append(pos)
        pos = align(pos + t.numel() * t.element_size())
    return offsets, pos


def encode_manifest(
    *,
    job: str,
    owner: int,
    world_size: int,
    iteration: int,
    wall: float,
    tree: Any,
    entries: list[TensorEntry],
) -> bytes:
    """The manifest's JSON bytes."""
    head = manifest_head(head_prefix(job=job, owner=owner, world_size=world_size), iteration, wall)
    frame = entries_frame([entry_parts(e) for e in entries])
    return join_manifest(head, encode_tree(tree), frame, [e.crc for e in entries])


# The manifest is spliced from pieces so that a save encodes on the training thread only
# what it must (the head and the tree, to reserve room) and the writer thread adds the
# checksums without encoding anything again. The bytes are those of ``json.dumps`` of
# {"format", "job", "owner", "world_size", "iteration", "wall", "tree", "tensors"}.
_SEP = (",", ":")
CRC_DIGITS = 10  # str(0xFFFFFFFF)


def head_prefix(*, job: str, owner: int, world_size: int) -> str:
    """The start of the manifest's JSON, the same for every save of one owner."""
    doc = {"format": FORMAT_VERSION, "job": job, "owner": owner, "world_size": world_size}
    return json.dumps(doc, separators=_SEP)[:-1] + ","


def manifest_head(prefix: str, iteration: int, wall: float) -> str:
    """The manifest's JSON up to (not including) the tree."""
    if not math.isfinite(wall):
        raise ValueError(f"wall time {wall!r}")
    return f'{prefix}"iteration":{int(iteration)},"wall":{float(wall)!r}'


def encode_tree(tree: Any) -> str:
    """The state tree's JSON."""
    return json.dumps(tree, separators=_SEP)


def entry_parts(e: TensorEntry) -> tuple[str, str]:
    """One tensor entry's JSON before and after its CRC (which the writer fills in)."""
    return (
        json.dumps([e.dtype, list(e.shape), e.offset, e.nbytes], separators=_SEP)[:-1] + ",",
        "," + json.dumps(e.device) + "]",
    )


def parts_bound(parts: list[tuple[str, str]]) -> int:
    """The most bytes the tensor entries of :func:`join_manifest` take (any CRCs)."""
    return sum(len(a) + len(b) + CRC_DIGITS + 1 for a, b in parts)


def manifest_bound(head: str, tree_json: str, parts_len: int) -> int:
    """The most bytes :func:`join_manifest` gives for these pieces (any CRCs);
    ``parts_len`` is :func:`parts_bound` of the entries."""
    if head.isascii() and tree_json.isascii():  # json.dumps's ensure_ascii: always
        text = len(head) + len(tree_json)
    else:
        text = len((head + tree_json).encode("utf-8"))
    return text + parts_len + len(',"tree":,"tensors":[]}')


def entries_frame(parts: list[tuple[str, str]]) -> list[str]:
    """The tensor entries' JSON around their CRCs, one more piece than entries: the
    entries are ``frame[0] + crc[0] + frame[1] + ... + crc[n-1] + frame[n]``."""
    if not parts:
        return [""]
    frame = [parts[0][0]]
    for (_, after), (before, _) in itertools.pairwise(parts):
        frame.append(after + "," + before)
    frame.append(parts[-1][1])
    return frame


def join_manifest(head: str, tree_json: str, frame: list[str], crcs: list[int]) -> bytes:
    """The manifest's bytes from its pieces and each tensor's CRC32; ``frame`` is
    :func:`entries_frame` of the entries (one string join, no formatting per entry)."""
    if len(frame) != len(crcs) + 1:
        raise ValueError(f"{len(crcs)} CRCs for {len(frame) - 1} tensor entries")
    pieces = [""] * (2 * len(crcs) + 1)
    pieces[0::2] = frame
    pieces[1::2] = map(str, crcs)
    return f'{head},"tree":{tree_json},"tensors":[{"".join(pieces)}]}}'.encode()


def encode_preamble(pre: Preamble) -> bytes:
    """The preamble's bytes, padded to PREAMBLE_SIZE, with its CRC."""
    body = _PRE.pack(
        MAGIC,
        FORMAT_VERSION,
        pre.iteration,
        pre.owner,
        pre.world_size,
        pre.data_len,
        pre.manifest_off,
        pre.manifest_len,
        pre.manifest_crc,
        pre.total_len,
    )
    raw = body + _CRC.pack(crc32(body))
    return raw + b"\x00" * (PREAMBLE_SIZE - len(raw))


def parse_preamble(buf: memoryview | bytes) -> Preamble:
    """The preamble at the start of ``buf``; SnapshotError if it is not a valid one."""
    if len(buf) < _PRE.size + _CRC.size:
        raise SnapshotError("shorter than a preamble")
    body = bytes(buf[: _PRE.size])
    (crc,) = _CRC.unpack(bytes(buf[_PRE.size : _PRE.size + _CRC.size]))
    magic, version, it, owner, world, data_len, m_off, m_len, m_crc, total = _PRE.unpack(body)
    if magic != MAGIC:
        raise SnapshotError("no snapshot preamble (never completed, or not a snapshot)")
    if crc32(body) != crc:
        raise SnapshotError("preamble checksum does not match")
    if version != FORMAT_VERSION:
        raise SnapshotError(f"format version {version}, this nvrx reads {FORMAT_VERSION}")
    if not (
        m_off >= PREAMBLE_SIZE
        and m_off + m_len <= total
        and 0 < m_len <= _MAX_MANIFEST
        and data_len <= m_off
    ):
        raise SnapshotError("preamble offsets are inconsistent")
    return Preamble(it, owner, world, data_len, m_off, m_len, m_crc, total)


def parse(
    buf: memoryview,
    *,
    job: str,
    world_size: int | None = None,
    verify_tensors: bool = True,
) -> tuple[Preamble, Manifest]:
    """Check and parse a whole snapshot held in ``buf``; SnapshotError if unusable."""
    pre = parse_preamble(buf)
    if len(buf) < pre.total_len:
        raise SnapshotError(f"truncated: {len(buf)} bytes of {pre.total_len}")
    raw = buf[pre.manifest_off : pre.manifest_off + pre.manifest_len]
    if crc32(raw) != pre.manifest_crc:
        raise SnapshotError("manifest checksum does not match")
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"manifest is not JSON: {exc}") from None
    man = _manifest(doc, pre)
    if man.job != job:
        raise SnapshotError(f"snapshot of job {man.job!r}, this is job {job!r}")
    if world_size is not None and man.world_size != world_size:
        raise SnapshotError(f"snapshot of a world of {man.world_size}, this one is {world_size}")
    if verify_tensors:
        for i, e in enumerate(man.tensors):
            if crc32(buf[e.offset : e.offset + e.nbytes]) != e.crc:
                raise SnapshotError(f"tensor {i} checksum does not match")
    return pre, man


def _manifest(doc: object, pre: Preamble) -> Manifest:
    if not isinstance(doc, dict):
        raise SnapshotError("manifest is not an object")
    if doc.get("format") != FORMAT_VERSION:
        raise SnapshotError(f"manifest format {doc.get('format')!r}")
    try:
        job, owner, world = doc["job"], doc["owner"], doc["world_size"]
        iteration, wall, tree, raw_tensors = (
            doc["iteration"],
            doc["wall"],
            doc["tree"],
            doc["tensors"],
        )
    except KeyError as exc:
        raise SnapshotError(f"manifest lacks {exc}") from None
    if not isinstance(job, str) or (owner, world, iteration) != (
        pre.owner,
        pre.world_size,
        pre.iteration,
    ):
        raise SnapshotError("manifest and preamble disagree")
    if (
        type(wall) not in (int, float)
        or not math.isfinite(wall)
        or not isinstance(raw_tensors, list)
    ):
        raise SnapshotError("manifest fields have the wrong types")
    entries: list[TensorEntry] = []
    for item in raw_tensors:
        try:
            dtype, shape, offset, nbytes, crc, device = item
            shape_t = tuple(int(s) for s in shape)
            if not (
                isinstance(dtype, str)
                and isinstance(device, str)
                and all(type(v) is int for v in (offset, nbytes, crc))
                and all(s >= 0 for s in shape_t)
            ):
                raise TypeError
        except (TypeError, ValueError):
            raise SnapshotError("malformed tensor entry") from None
        element = torch.empty(0, dtype=dtype_of(dtype)).element_size()
        if math.prod(shape_t) * element != nbytes or not (
            offset >= PREAMBLE_SIZE and offset + nbytes <= PREAMBLE_SIZE + pre.data_len
        ):
            raise SnapshotError("tensor entry does not fit its shape or the data region")
        entries.append(TensorEntry(dtype, shape_t, offset, nbytes, crc, device))
    return Manifest(job, owner, world, iteration, float(wall), tree, tuple(entries))


def tensor_view(buf: memoryview, entry: TensorEntry) -> torch.Tensor:
    """A CPU tensor over ``buf``'s bytes of ``entry`` (no copy; ``buf`` must stay alive)."""
    dtype = dtype_of(entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
    return raw.view(dtype).reshape(entry.shape)
