"""tools/check_links.py and check_commit_subjects.py: links resolve, subjects are short."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "tools" / "check_links.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_links"] = module
    spec.loader.exec_module(module)
    return module


check_links = _load()


def test_the_repository_has_no_broken_link() -> None:
    found = [p for path in check_links.markdown_files() for p in check_links.problems(path)]
    assert found == []


def test_each_kind_of_broken_link_is_named(tmp_path: pathlib.Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n(a-target)=\n## Part `two`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n"
        "[ok](other.md) [ok](other.md#other-page) [ok](other.md#part-two) [ok](#title)\n"
        "[ok](other.md#a-target) [web](https://example.org/x)\n"
        "[gone](missing.md)\n"
        "[bad anchor](other.md#nope)\n"
        "[bad local anchor](#nowhere)\n"
        "see https://nvrx.github.io/nvrx/ for more\n"
        "the planned home is https://github.com/nvrx/nvrx\n"
        "```\n[in code](missing.md) https://nvrx.github.io/\n```\n"
    )
    assert check_links.problems(page, tmp_path) == [
        "page.md:4: 'missing.md': no such file in the repository",
        "page.md:5: 'other.md#nope': no heading or target 'nope'",
        "page.md:6: '#nowhere': no heading or target 'nowhere'",
        "page.md:7: links to the planned home (nothing is published there yet): link a file "
        "of the repository or say 'planned home'",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("What it costs", "what-it-costs"),
        ("Differences from NVRx", "differences-from-nvrx"),
        ("`ft_launcher` options", "ft_launcher-options"),
        ("Securing the rendezvous store", "securing-the-rendezvous-store"),
        ("Step 1: install (CPU)", "step-1-install-cpu"),
    ],
)
def test_slugs_are_mysts(heading: str, anchor: str) -> None:
    assert check_links.slug(heading) == anchor


def _load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_commit_subjects_over_72_characters_are_named() -> None:
    tool = _load_tool("check_commit_subjects")
    assert tool.long_subjects(["short", "x" * 72, "y" * 73]) == ["y" * 73]
    subjects = tool.subjects_since()
    if subjects is not None:  # a git checkout: the rule holds on this branch
        assert tool.long_subjects(subjects) == []
