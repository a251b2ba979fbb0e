"""cluster_options refuses, at start-up, a cycle-info directory it could not write into."""

from __future__ import annotations

import argparse
import os
import pathlib

import pytest

from nvrx.ft import FaultToleranceConfig
from nvrx.launcher._cluster import cluster_options


def _args() -> argparse.Namespace:
    return argparse.Namespace(
        nproc_per_node="1",
        ft_node_health_check_cmd=None,
        ft_cycle_info_job_id=None,
        ft_per_cycle_applog_prefix=None,
    )


def _unwritable_dir(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o555)
    if not os.access(path, os.W_OK):
        return str(path)
    # root writes through any mode bits; a procfs directory refuses even root
    for candidate in ("/proc/self", "/proc/sys"):
        if os.path.isdir(candidate) and not os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    pytest.skip("no directory here that this user cannot write")


def test_an_unwritable_cycle_info_dir_is_refused_naming_option_and_value(
    tmp_path: pathlib.Path,
) -> None:
    where = _unwritable_dir(tmp_path)
    cfg = FaultToleranceConfig(cycle_info_dir=where)
    with pytest.raises(ValueError, match="--ft-cycle-info-dir") as caught:
        cluster_options(_args(), cfg, env={})
    assert repr(where) in str(caught.value)
    assert "writable" in str(caught.value)


def test_a_writable_cycle_info_dir_is_taken(tmp_path: pathlib.Path) -> None:
    cfg = FaultToleranceConfig(cycle_info_dir=str(tmp_path))
    assert cluster_options(_args(), cfg, env={}).cycle_info_dir == str(tmp_path)
