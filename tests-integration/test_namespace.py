"""The four distributions install side by side into one ``nvrx`` namespace."""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib

import pytest

import nvrx

SUBPACKAGES = {
    "nvrx.ft": "nvrx-ft-core",
    "nvrx.launcher": "nvrx-ft-launcher",
    "nvrx.straggler": "nvrx-straggler",
    "nvrx.ptl": "nvrx-ptl",
}


@pytest.mark.parametrize(("module", "dist"), sorted(SUBPACKAGES.items()))
def test_each_subpackage_comes_from_its_distribution(module: str, dist: str) -> None:
    imported = importlib.import_module(module)
    version_file = pathlib.Path(__file__).resolve().parents[1] / "VERSION"
    assert imported.__version__ == version_file.read_text().strip()
    assert importlib.metadata.version(dist) == imported.__version__


def test_namespace_spans_every_distribution() -> None:
    assert getattr(nvrx, "__file__", None) is None
    assert len(list(nvrx.__path__)) >= len(SUBPACKAGES)
