"""The installed distribution is what the repository says it is."""

import pathlib

import nvrx.ft


def test_version_matches_repository() -> None:
    version_file = pathlib.Path(__file__).resolve().parents[3] / "VERSION"
    assert nvrx.ft.__version__ == version_file.read_text().strip()


def test_nvrx_is_a_namespace_package() -> None:
    import nvrx

    assert getattr(nvrx, "__file__", None) is None
