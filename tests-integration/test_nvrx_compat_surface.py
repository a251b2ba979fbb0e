"""The migration guide's tables cannot drift: every row is checked against our code.

Each NVRx name we say we keep imports and accepts the keywords NVRx callers pass; each
config field has the default we state and every NVRx spelling of its option parses
to the same value; each launcher option parses (or, where we say it is not provided,
is refused); each stated outcome is computed from our code. The other way round, every
public name, config field and ``--ft-*`` option of ours has a row, and the guide's
tables are exactly what ``nvrx_surface.render()`` makes of the data.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from nvrx_surface import (
    ADDED_NAMES,
    BEHAVIOURS,
    FIELDS,
    FLAGS,
    GUIDE,
    MISSING,
    NAMES,
    Behaviour,
    Field,
    Flag,
    Name,
    Status,
    generated_part,
    render,
)

from nvrx.ft import FaultToleranceConfig

#: Rows whose nvrx side has not landed yet: {test id: reason}. Strict, so a row that
#: starts passing must leave this list.
PENDING: dict[str, str] = {}


def _params(rows: Any, ids: Any) -> list[Any]:
    out = []
    for row in rows:
        rid = ids(row)
        marks = [pytest.mark.xfail(strict=True, reason=PENDING[rid])] if rid in PENDING else []
        out.append(pytest.param(row, id=rid, marks=marks))
    return out


def resolve(dotted: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from nvrx.launcher.cli import get_parser

    return get_parser()


def test_guide_tables_are_rendered_from_the_data() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert generated_part(text) == render(), (
        "docs/guides/migration.md differs from the data; run "
        "`python tests-integration/nvrx_surface.py --write`"
    )


# ------------------------------------------------------------------------- names


def _accepts(obj: Any, param: str) -> bool:
    if hasattr(obj, param):
        return True
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    found = parameters.get(param)
    return found is not None and found.kind is not inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize(
    "name", _params([n for n in NAMES if n.ours], lambda n: n.nvrx.split(".", 1)[1])
)
def test_nvrx_name_has_its_counterpart(name: Name) -> None:
    assert name.ours is not None
    obj = resolve(name.ours)
    missing = [p for p in name.params if not _accepts(obj, p)]
    assert not missing, f"{name.ours} lacks what NVRx callers use: {missing}"


@pytest.mark.parametrize("name", _params(ADDED_NAMES, lambda n: n.ours))
def test_added_name_exists(name: Name) -> None:
    assert name.ours is not None
    resolve(name.ours)


@pytest.mark.parametrize("package", ["nvrx.ft", "nvrx.straggler", "nvrx.ptl", "nvrx.launcher"])
def test_every_public_name_has_a_row(package: str) -> None:
    module = importlib.import_module(package)
    covered = set()
    for row in (*NAMES, *ADDED_NAMES):
        if row.ours and row.ours.startswith(package + "."):
            covered.update(row.ours[len(package) + 1 :].split("."))
    public = {n for n in module.__all__ if not n.startswith("__")}
    assert public <= covered, (
        f"{package} exports names the migration table does not list: {sorted(public - covered)}"
    )


# ------------------------------------------------------------------------ fields


def _default(name: str) -> Any:
    return getattr(FaultToleranceConfig(), name)


def _spellings(field: str) -> list[str]:
    dashed = field.replace("_", "-")
    return sorted(
        {f"--ft-{dashed}", f"--ft-{field}", f"--ft-param-{field}", f"--ft-param-{dashed}"}
    )


def _nvrx_value(field: Field) -> Any:
    return field.nvrx_07 if field.nvrx_07 is not MISSING else field.nvrx_041


@pytest.mark.parametrize("field", _params(FIELDS, lambda f: f.name))
def test_config_field(field: Field, parser: argparse.ArgumentParser) -> None:
    if field.status is Status.NOT_PROVIDED:
        assert field.name not in FaultToleranceConfig.field_names()
        return
    spec = FaultToleranceConfig.field_spec(field.name)
    assert _default(field.name) == field.ours, (
        f"FaultToleranceConfig().{field.name} is {_default(field.name)!r}, "
        f"the guide says {field.ours!r}"
    )
    without_effect = field.status in (Status.ACCEPTED, Status.RENAMED)
    assert (spec.without_effect is not None) == without_effect, (
        f"{field.name}: the guide says {field.status.value!r}, the code says "
        f"without_effect={spec.without_effect!r}"
    )
    if field.status is not Status.ADDED:
        # An NVRx YAML carrying the field loads even when unknown keys are errors.
        FaultToleranceConfig.from_kwargs(
            ignore_not_recognized=False, **{field.name: _nvrx_value(field)}
        )
    if field.status is Status.RENAMED:
        assert field.renamed_to in parser._option_string_actions
    if not spec.cli:
        return
    given: dict[str, Any] = {field.name: field.example}
    expected = getattr(FaultToleranceConfig(**given), field.name)
    for spelling in _spellings(field.name):
        args = parser.parse_args([f"{spelling}={field.example}", "train.py"])
        assert getattr(FaultToleranceConfig.from_args(args), field.name) == expected, spelling


def test_every_config_field_has_a_row() -> None:
    listed = {f.name for f in FIELDS}
    missing = set(FaultToleranceConfig.field_names()) - listed
    assert not missing, f"FaultToleranceConfig fields missing from the table: {sorted(missing)}"


# ------------------------------------------------------------------------- flags


def _concrete(flag: Flag) -> Iterator[str]:
    yield from (s for s in flag.nvrx if "<" not in s)


def _canonical(option: str) -> str:
    """``--ft_param_a_b``, ``--ft-param-a-b`` and ``--ft-a_b`` all name ``ft-a-b``."""
    name = option.lstrip("-").replace("_", "-")
    return "ft-" + name[len("ft-param-") :] if name.startswith("ft-param-") else name


def _parse_each_spelling(
    flag: Flag, parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    options = parser._option_string_actions
    for spelling in _concrete(flag):
        if flag.status is Status.NOT_PROVIDED:
            assert spelling not in options, f"{spelling} exists now: update its row"
            with pytest.raises(SystemExit):
                parser.parse_args([f"{spelling}={flag.example or 1}", "train.py"])
            capsys.readouterr()
            continue
        assert spelling in options, f"ft_launcher does not accept {spelling}"
        action = options[spelling]
        if flag.status is Status.ADDED:
            continue
        if action.nargs == 0:
            parser.parse_args([spelling, "train.py"])
            continue
        value = str(next(iter(action.choices))) if action.choices else flag.example or "1"
        parser.parse_args([f"{spelling}={value}", "train.py"])


@pytest.mark.parametrize("flag", _params(FLAGS, lambda f: f.nvrx[0]))
def test_launcher_option(
    flag: Flag, parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    _parse_each_spelling(flag, parser, capsys)
    if flag.ours and flag.ours.startswith("--") and "<" not in flag.ours:
        assert flag.ours in parser._option_string_actions
    if flag.dest is not None and flag.ours_default is not MISSING:
        assert parser.parse_args(["train.py"]).__dict__.get(flag.dest) == flag.ours_default


def test_every_ft_option_has_a_row(parser: argparse.ArgumentParser) -> None:
    listed = {_canonical(s) for f in FLAGS for s in (*f.nvrx, f.ours or "")}
    listed.update(f"ft-{f.name.replace('_', '-')}" for f in FIELDS)
    ours = {s for s in parser._option_string_actions if s.lstrip("-").startswith("ft")}
    missing = sorted(s for s in ours if _canonical(s) not in listed)
    assert not missing, f"ft_launcher options missing from the table: {missing}"


# --------------------------------------------------------------------- behaviour


@pytest.mark.parametrize(
    "row", _params([b for b in BEHAVIOURS if b.probe], lambda b: b.what.split(" (")[0])
)
def test_stated_outcome_is_what_our_code_does(row: Behaviour) -> None:
    assert row.probe is not None
    assert row.probe() == row.expect, f"{row.what}: the guide says {row.ours!r}"
