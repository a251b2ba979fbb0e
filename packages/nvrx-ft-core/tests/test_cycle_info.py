"""The cycle-info file: written atomically, read back without trusting it, schema shipped."""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import stat
import threading
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nvrx.ft
from nvrx.ft import (
    CYCLE_INFO_ENV,
    CYCLE_INFO_SCHEMA_VERSION,
    CycleGoodput,
    CycleInfo,
    CycleNode,
    cycle_info_schema_path,
    read_cycle_info,
    write_cycle_info,
)
from nvrx.ft._formats.cycle_info import MAX_CYCLE_INFO_BYTES

LOGGER = "nvrx.ft.cycle_info"


def _info(**overrides: Any) -> CycleInfo:
    fields: dict[str, Any] = {
        "job_id": "4242",
        "attempt": 1,
        "cycle": 2,
        "restart_count": 2,
        "started_at": 1_764_590_000.25,
        "ended_at": 1_764_590_100.5,
        "cause": "crash: rank 1 exited with 1",
        "nodes": (CycleNode("node-a", 0), CycleNode("node-b", 1)),
        "standby_nodes": ("node-c",),
        "ranks": (0, 1, 2, 3),
        "exit_codes": {0: 0, 1: 1, 2: -9, 3: 0},
        "log_file": "/logs/app_cycle2.log",
        "goodput": CycleGoodput(productive_s=80.0, wall_s=100.0, ettr=0.8),
    }
    fields.update(overrides)
    return CycleInfo(**fields)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    schema = json.loads(cycle_info_schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_the_names_are_nvrx_ft_public_api() -> None:
    assert CYCLE_INFO_ENV == "NVRX_CURRENT_CYCLE_INFO"
    assert CYCLE_INFO_SCHEMA_VERSION == 1
    for name in ("CycleInfo", "CycleNode", "CycleGoodput", "read_cycle_info", "write_cycle_info"):
        assert name in nvrx.ft.__all__


def test_written_file_reads_back_equal_with_mode_0600_and_no_temp_left(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cycle_info.4242.1.2"
    info = _info()
    write_cycle_info(path, info)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) == info
        assert read_cycle_info(str(path)) == info
    assert _warnings(caplog) == []
    document = json.loads(path.read_text())
    _validator().validate(document)
    assert document["exit_codes"] == {"0": 0, "1": 1, "2": -9, "3": 0}
    assert info.world_size == 4
    assert info.ended


def test_a_running_cycle_has_no_end_exit_codes_or_goodput(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c"
    info = CycleInfo(job_id="", cycle=0, restart_count=0, started_at=1.0e9)
    write_cycle_info(path, info)
    back = read_cycle_info(path)
    assert back == info
    assert back is not None
    assert not back.ended
    assert back.exit_codes is None
    assert back.goodput is None
    assert back.cause is None
    assert back.world_size == 0
    _validator().validate(json.loads(path.read_text()))


def test_rewrite_replaces_in_one_step_while_a_reader_polls(tmp_path: pathlib.Path) -> None:
    """A reader polling during 40 rewrites sees the old file or the new one, never half."""
    path = tmp_path / "c"
    big = _info(ranks=tuple(range(5_000)), exit_codes=None)
    write_cycle_info(path, big)
    stop = threading.Event()
    seen: list[CycleInfo | None] = []

    def poll() -> None:
        while not stop.is_set():
            seen.append(read_cycle_info(path))

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    try:
        for cycle in range(40):
            write_cycle_info(path, _info(ranks=big.ranks, exit_codes=None, cycle=cycle))
    finally:
        stop.set()
        reader.join(timeout=30)
    assert seen
    assert all(s is not None and s.world_size == 5_000 for s in seen)


def test_path_defaults_to_the_variable_and_unset_is_silent(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c"
    write_cycle_info(path, _info())
    monkeypatch.delenv(CYCLE_INFO_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert read_cycle_info() is None
        monkeypatch.setenv(CYCLE_INFO_ENV, "")
        assert read_cycle_info() is None
    assert _warnings(caplog) == []
    monkeypatch.setenv(CYCLE_INFO_ENV, str(path))
    assert read_cycle_info() == _info()


def test_follows_a_current_symlink_as_nvrx_lays_the_files_out(tmp_path: pathlib.Path) -> None:
    write_cycle_info(tmp_path / "cycle_info.4242.1.2", _info())
    link = tmp_path / "cycle_info.4242.current"
    link.symlink_to("cycle_info.4242.1.2")
    assert read_cycle_info(link) == _info()


def _good() -> dict[str, Any]:
    return _info().to_dict()


def _with(**changes: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        document = _good()
        for key, value in changes.items():
            if value is _DROP:
                del document[key]
            else:
                document[key] = value
        return document

    return make


_DROP = object()

#: Documents both the schema and the reader refuse.
BROKEN: dict[str, Callable[[], object]] = {
    "other schema version": _with(schema_version=2),
    "schema version true": _with(schema_version=True),
    "missing key": _with(cycle=_DROP),
    "unknown key": _with(extra=1),
    "cycle negative": _with(cycle=-1),
    "cycle a bool": _with(cycle=True),
    "cycle huge": _with(cycle=2**40),
    "restart_count a string": _with(restart_count="2"),
    "attempt negative": _with(attempt=-1),
    "job_id not a string": _with(job_id=4242),
    "job_id too long": _with(job_id="j" * 256),
    "started_at a string": _with(started_at="2026-12-01T12:00:00Z"),
    "started_at negative": _with(started_at=-1.0),
    "started_at year 3000": _with(started_at=3.3e10),
    "ended_at a string": _with(ended_at="later"),
    "cause a number": _with(cause=1),
    "cause too long": _with(cause="x" * 4097),
    "nodes not a list": _with(nodes={"node_id": "a", "group_rank": 0}),
    "node without group rank": _with(nodes=[{"node_id": "a"}]),
    "node with extra key": _with(nodes=[{"node_id": "a", "group_rank": 0, "x": 1}]),
    "node id empty": _with(nodes=[{"node_id": "", "group_rank": 0}]),
    "group rank negative": _with(nodes=[{"node_id": "a", "group_rank": -1}]),
    "standby not strings": _with(standby_nodes=[1]),
    "ranks not ints": _with(ranks=["0"], exit_codes=None),
    "rank negative": _with(ranks=[-1], exit_codes=None),
    "rank twice": _with(ranks=[0, 0], exit_codes=None),
    "exit codes a list": _with(exit_codes=[0, 1]),
    "exit code key not decimal": _with(exit_codes={"one": 1}),
    "exit code key padded": _with(exit_codes={"01": 1}),
    "exit code too large": _with(exit_codes={"0": 256}),
    "exit code a string": _with(exit_codes={"0": "0"}),
    "log_file empty": _with(log_file=""),
    "goodput a number": _with(goodput=0.8),
    "goodput missing ettr": _with(goodput={"productive_s": 1.0, "wall_s": 2.0}),
    "ettr above one": _with(goodput={"productive_s": 1.0, "wall_s": 2.0, "ettr": 1.5}),
    "wall negative": _with(goodput={"productive_s": 0.0, "wall_s": -2.0, "ettr": 0.0}),
    "not an object": lambda: [_good()],
}

#: Documents the schema accepts but the reader refuses (relations between fields).
REFUSED_BY_READER_ONLY: dict[str, Callable[[], object]] = {
    "cycle 2.0 (an integer to JSON Schema)": _with(cycle=2.0),
    "ended before started": _with(ended_at=1_764_589_000.0),
    "node id twice": _with(
        nodes=[{"node_id": "a", "group_rank": 0}, {"node_id": "a", "group_rank": 1}]
    ),
    "group rank twice": _with(
        nodes=[{"node_id": "a", "group_rank": 0}, {"node_id": "b", "group_rank": 0}]
    ),
    "active and standby": _with(standby_nodes=["node-a"]),
    "exit code of a rank not in the cycle": _with(exit_codes={"9": 0}),
    "productive above wall": _with(goodput={"productive_s": 3.0, "wall_s": 2.0, "ettr": 1.0}),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_schema_and_reader_refuse(
    name: str, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    document = BROKEN[name]()
    assert not _validator().is_valid(document), name
    path = tmp_path / "c"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) is None
    [warning] = _warnings(caplog)
    assert str(path) in warning


@pytest.mark.parametrize("name", sorted(REFUSED_BY_READER_ONLY))
def test_reader_refuses_what_the_schema_cannot_say(
    name: str, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    document = REFUSED_BY_READER_ONLY[name]()
    assert _validator().is_valid(document), name
    path = tmp_path / "c"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) is None
    assert len(_warnings(caplog)) == 1


def test_other_schema_version_says_which(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c"
    path.write_text(json.dumps({"schema_version": 7, "anything": "else"}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) is None
    [warning] = _warnings(caplog)
    assert "schema_version=7" in warning
    assert "version 1 only" in warning


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b'{"schema_version": 1, "cycle": NaN}',
        b"\xff\xfe",
        b"[" * 100_000,
        b"null",
    ],
    ids=["empty", "truncated", "nan", "not utf-8", "deep", "null"],
)
def test_unreadable_content_is_one_warning(
    content: bytes, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) is None
    assert len(_warnings(caplog)) == 1


def test_missing_oversized_directory_and_fifo_are_one_warning_and_never_block(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = tmp_path / "big"
    with big.open("wb") as stream:
        stream.write(b" " * (MAX_CYCLE_INFO_BYTES + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: an open without O_NONBLOCK would hang the test
    cases = {"missing": tmp_path / "none", "big": big, "dir": tmp_path, "fifo": fifo}
    for name, path in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert read_cycle_info(path) is None, name
        [warning] = _warnings(caplog)
        assert str(path) in warning, name
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(big) is None
    assert "larger than" in _warnings(caplog)[0]


def test_unreadable_file_is_one_warning(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a 0000 file")
    path = tmp_path / "c"
    write_cycle_info(path, _info())
    path.chmod(0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_cycle_info(path) is None
    assert "Permission denied" in _warnings(caplog)[0]


@pytest.mark.parametrize(
    "changes",
    [
        {"cycle": -1},
        {"started_at": float("nan")},
        {"ended_at": 1.0},
        {"nodes": ("node-a",)},
        {"exit_codes": {7: 0}},
        {"goodput": {"productive_s": 1.0}},
        {"schema_version": 2},
        {"schema_version": 1.0},
        {"log_file": ""},
        {"cause": "x\udcff"},  # a lone surrogate: it could not be written as UTF-8
    ],
)
def test_a_launcher_cannot_build_a_file_readers_refuse(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(changes))):
        _info(**changes)


def test_write_refuses_a_non_cycle_info(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError):
        write_cycle_info(tmp_path / "c", _good())  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_schema_file_ships_inside_the_package() -> None:
    path = cycle_info_schema_path()
    # Beside the format's module, with the other shared formats.
    assert path.parent == pathlib.Path(nvrx.ft.__file__).parent / "_formats"
    assert path.name == "cycle_info.schema.json"
    schema = json.loads(path.read_text())
    assert schema["properties"]["schema_version"] == {"const": CYCLE_INFO_SCHEMA_VERSION}
    assert set(schema["required"]) == set(_good())


_ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)


@st.composite
def _infos(draw: st.DrawFn) -> CycleInfo:
    started = draw(st.floats(0, 2.0**33, allow_nan=False))
    ended = draw(st.none() | st.floats(started, 2.0**33, allow_nan=False))
    node_ids = draw(st.lists(_ids, max_size=5, unique=True))
    standby = draw(st.lists(_ids.filter(lambda n: n not in node_ids), max_size=3))
    ranks = draw(st.lists(st.integers(0, 2**31 - 1), max_size=8, unique=True))
    codes = draw(
        st.none()
        | st.dictionaries(st.sampled_from(ranks) if ranks else st.nothing(), st.integers(-255, 255))
    )
    wall = draw(st.floats(0, 1e8, allow_nan=False))
    goodput = draw(
        st.none()
        | st.builds(
            CycleGoodput,
            productive_s=st.floats(0, wall, allow_nan=False),
            wall_s=st.just(wall),
            ettr=st.floats(0, 1, allow_nan=False),
        )
    )
    return CycleInfo(
        job_id=draw(st.text(max_size=30)),
        attempt=draw(st.integers(0, 2**31 - 1)),
        cycle=draw(st.integers(0, 2**31 - 1)),
        restart_count=draw(st.integers(0, 2**31 - 1)),
        started_at=started,
        ended_at=ended,
        cause=draw(st.none() | st.text(max_size=50)),
        nodes=tuple(CycleNode(n, i) for i, n in enumerate(node_ids)),
        standby_nodes=tuple(standby),
        ranks=tuple(ranks),
        exit_codes=codes,
        log_file=draw(st.none() | st.text(min_size=1, max_size=30)),
        goodput=goodput,
    )


@settings(max_examples=60, deadline=None)
@given(info=_infos())
def test_every_valid_info_matches_the_schema_and_round_trips(info: CycleInfo) -> None:
    document = json.loads(json.dumps(info.to_dict()))
    _validator().validate(document)
    assert CycleInfo.from_dict(document) == info
