"""What keeps a snapshot's background work cheap: ISA-L's CRC-32, a nicer writer thread."""

from __future__ import annotations

import os
import pathlib
import platform
import random
import subprocess
import sys
import threading
import zlib

import pytest
import torch

from nvrx.ft.checkpointing.local import (
    LocalCheckpoints,
    LocalCkptSettings,
    RestoreSource,
    _crc,
    _engine,
    _format,
)
from nvrx.ft.checkpointing.local._background import NICE_INCREMENT

pytestmark = pytest.mark.timeout(120)

ISAL_DECLARED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def _state(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(3_000_001, generator=g),  # not a multiple of any vector width
        "b": torch.randn(17, dtype=torch.float64, generator=g),
        "step": seed,
    }


@pytest.mark.skipif(not ISAL_DECLARED, reason="isal is a dependency on Linux x86_64/aarch64 only")
def test_isal_is_used_where_it_is_a_dependency() -> None:
    assert _crc.IMPLEMENTATION == "isal"


@pytest.mark.parametrize("size", [0, 1, 7, 64, 4095, 4096, 65_537, 3_000_003])
def test_crc_equals_zlib_on_any_length_and_continues(size: int) -> None:
    view = memoryview(random.Random(size).randbytes(size))  # no numpy needed
    assert _crc.crc32(view) == zlib.crc32(view)
    half = size // 2
    assert _crc.crc32(view[half:], _crc.crc32(view[:half])) == zlib.crc32(view)


def test_without_isal_zlib_computes_it() -> None:
    code = (
        "import sys; sys.modules['isal'] = None\n"
        "from nvrx.ft.checkpointing.local import _crc\n"
        "import zlib\n"
        "assert _crc.crc32 is zlib.crc32, _crc.crc32\n"
        "print(_crc.IMPLEMENTATION)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "zlib"


@pytest.mark.parametrize("writer", ["zlib", "fast"])
def test_snapshot_written_with_one_crc_restores_with_the_other(
    writer: str, node_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, slow = _crc.crc32, zlib.crc32
    settings = LocalCkptSettings(node_dir=node_dir, job_id="job-crc")
    write_with, read_with = (slow, fast) if writer == "zlib" else (fast, slow)
    monkeypatch.setattr(_engine, "crc32", write_with)
    monkeypatch.setattr(_format, "crc32", write_with)
    lc = LocalCheckpoints(settings)
    assert lc.save(3, _state(3))
    assert lc.wait(60)
    lc.close()
    monkeypatch.setattr(_engine, "crc32", read_with)
    monkeypatch.setattr(_format, "crc32", read_with)
    again = LocalCheckpoints(settings)
    try:
        got = again.restore(_state(0), global_iteration=None)
    finally:
        again.close()
    assert (got.source, got.iteration) == (RestoreSource.OWN, 3)
    assert got.state is not None
    want = _state(3)
    for key in ("w", "b"):
        have, expected = got.state[key], want[key]
        assert isinstance(have, torch.Tensor)
        assert isinstance(expected, torch.Tensor)
        assert torch.equal(have, expected)


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no thread niceness here")
def test_writer_thread_runs_nicer_than_training(node_dir: pathlib.Path) -> None:
    me = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, me)
    earlier = set(threading.enumerate())  # other tests' writers may still be running
    lc = LocalCheckpoints(LocalCkptSettings(node_dir=node_dir, job_id="job-nice"))
    try:
        assert lc.save(1, _state(1))
        assert lc.wait(60)
        writers = [
            t for t in set(threading.enumerate()) - earlier if t.name == "nvrx-local-ckpt-writer"
        ]
        assert len(writers) == 1
        assert writers[0].native_id is not None
        nice = os.getpriority(os.PRIO_PROCESS, writers[0].native_id)
    finally:
        lc.close()
    assert nice == min(19, before + NICE_INCREMENT)
    assert os.getpriority(os.PRIO_PROCESS, me) == before  # the training thread keeps its own
