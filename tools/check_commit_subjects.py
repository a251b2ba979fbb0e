"""Fail when a commit subject since the rule began is longer than 72 characters.

CONTRIBUTING.md ("Commits"): the subject says what changed, the body says why. The
commits before the rule (up to ``SINCE``) are history and are not checked. Outside a
git checkout (an sdist) there is nothing to check.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The last commit before the rule; every commit after it is checked.
SINCE = "2a2b943002d2b335cf8f658234f75d3bed122bdd"
MAX_SUBJECT = 72
#: Commits merged with a long subject before it was caught, which cannot be rewritten
#: (history is never rewritten here); each with its length.
EXEMPT = frozenset(
    {
        "97e3aefd8f942ecfcd213bbdd7cbfd1d75ba60fa",  # 73: "launcher: every documented env ..."
        "5cd8cc44e27549cd6533c3b7a6a810281e7e2d5a",  # 73: "ptl: NeMo-shaped Hierarchical..."
        "7d20031dd9e4499353dea0ace3ae95f64ba55ecc",  # 73: "ptl tests: the DDP restart test..."
        "cc692d133abff300266b42c3a2939080e73c4685",  # 73: "metrics tests: real launcher..."
        "3be1a8b2657cf2bb97e566c1f9713a1c430fed83",  # 80: "launcher metrics: goodput/badput..."
    }
)


def long_subjects(subjects: list[str], limit: int = MAX_SUBJECT) -> list[str]:
    """The subjects over ``limit`` characters."""
    return [s for s in subjects if len(s) > limit]


def subjects_since(since: str = SINCE) -> list[str] | None:
    """Subjects of the commits after ``since`` (not :data:`EXEMPT`); None outside a
    checkout that has it."""
    try:
        out = subprocess.run(
            ["git", "log", "--format=%H %s", f"{since}..HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = (line.partition(" ") for line in out.splitlines())
    return [subject for sha, _, subject in found if sha not in EXEMPT]


def main() -> int:
    subjects = subjects_since()
    if subjects is None:
        print("no git history here: commit subjects not checked")
        return 0
    bad = long_subjects(subjects)
    for subject in bad:
        print(f"commit subject of {len(subject)} characters (at most {MAX_SUBJECT}): {subject}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
