"""docs/env.md lists every environment variable the packages read or set."""

from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: A string literal in the sources that names an environment variable.
_VARIABLE = re.compile(
    r"[\"']((?:NVRX|FT|FAULT_TOL|SLURM|TORCHELASTIC|PET|CUDA|XDG|GROUP|LOCAL|TORCH|OMP)"
    r"_[A-Z0-9_]+)[\"']"
)
#: Literals of that shape that are not variables (Python names in ``__all__`` lists).
NOT_VARIABLES = frozenset(
    {
        "NVRX_ONLY_ENV",
        "NVRX_ONLY_OPTIONS",
        "FT_LAUNCHER_IPC_SOCKET_ENV_VAR",
        "FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR",
        "FT_DIR_NAME",
        "FT_STATE_FILENAME",
        "LOCAL_CKPT_OPTS_KEY",
    }
)


def variables_in_sources() -> dict[str, list[str]]:
    """Each variable-like literal in the four packages' sources, with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        for match in _VARIABLE.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1)
            if name not in NOT_VARIABLES:
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_variable_the_code_names_is_documented() -> None:
    doc = (ROOT / "docs" / "env.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", doc))
    # NVRX_LOCAL_CKPT_* in the doc stands for the family.
    prefixes = {name[:-1] for name in re.findall(r"`([A-Z0-9_]+_\*)`", doc)}
    missing = {
        name: where
        for name, where in variables_in_sources().items()
        if name not in documented and not any(name.startswith(p) for p in prefixes)
    }
    assert missing == {}, f"docs/env.md does not list: {missing}"


def test_the_scan_finds_what_it_must() -> None:
    found = variables_in_sources()
    for name in (
        "NVRX_JOB_KEY",
        "SLURM_RESTART_CNT",
        "NVRX_SEGMENT_ID",
        "TORCHELASTIC_RESTART_COUNT",
    ):
        assert name in found
