"""Local checkpoints, the launcher's side: options, node directory, restore records, goodput."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.ft.checkpointing.local import _contract as contract
from nvrx.launcher import ExitCode, goodput
from nvrx.launcher._events import CheckpointRestored, Recorder
from nvrx.launcher._local_ckpt import (
    SPARE_PRELOAD,
    LocalCkptOptions,
    NodeDirectory,
    RestoreWatch,
    node_restore,
)
from nvrx.launcher.cli import get_parser, main
from nvrx.launcher.journal import JsonLines, schema_path

Start = Callable[..., Launcher]


@pytest.fixture
def base(tmp_path: pathlib.Path) -> pathlib.Path:
    """A private base directory (never the user's real /dev/shm)."""
    path = tmp_path / "shm"
    path.mkdir()
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in contract.ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def _record(local_rank: int, source: str, cycle: int = 1, iteration: int | None = 7) -> Any:
    return contract.RestoreRecord(
        restart_count=cycle,
        rank=local_rank,
        local_rank=local_rank,
        source=contract.RestoreSource(source),
        iteration=iteration,
        snapshot_wall=100.0 + local_rank if iteration is not None else None,
        restore_s=0.25 * (local_rank + 1),
        wall=200.0,
    )


# --- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--local-ckpt-dir", "/no/such/base"], {}, "--local-ckpt-dir: '/no/such/base'"),
        (["--local-ckpt-every-n-steps", "0"], {}, "'0'"),
        (["--local-ckpt-every-s", "-1"], {}, "--local-ckpt-every-s"),
        (["--local-ckpt-every-s", "nan"], {}, "'nan'"),
        (["--local-ckpt-replicas", "9"], {}, "'9'"),
        (["--local-ckpt-max-share", "1.5"], {}, "--local-ckpt-max-share"),
        (["--local-ckpt-max-share", "0"], {}, "'0'"),
        ([], {"PET_LOCAL_CKPT_REPLICAS": "many"}, "PET_LOCAL_CKPT_REPLICAS"),
        ([], {"PET_LOCAL_CKPT_DIR": "/no/such/base"}, "'/no/such/base'"),
    ],
)
def test_bad_values_exit_2_naming_them(
    argv: list[str],
    env: dict[str, str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        main(["--standalone", *argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    assert named in capsys.readouterr().err


def test_a_base_we_cannot_write_is_refused(base: pathlib.Path, capsys: Any) -> None:
    if os.getuid() == 0:
        pytest.skip("root writes anywhere")
    base.chmod(0o500)
    try:
        with pytest.raises(SystemExit) as info:
            main(["--standalone", f"--local-ckpt-dir={base}", "train.py"])
    finally:
        base.chmod(0o700)
    assert info.value.code == ExitCode.USAGE_ERROR
    assert "is not writable" in capsys.readouterr().err


def test_options_defaults_pet_variables_and_off(
    base: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvrx.launcher.cli import _options

    monkeypatch.chdir(base)
    (base / "x.py").touch()  # the training script must exist
    monkeypatch.setenv("PET_LOCAL_CKPT_EVERY_N_STEPS", "5")  # read when the parser is made
    parser = get_parser()
    given = parser.parse_args(
        [
            "--standalone",
            f"--local_ckpt_dir={base}",
            "--local-ckpt-every-s=2.5",
            "--local-ckpt-replicas=2",
            "--local-ckpt-max-share=0.25",
            "x.py",
        ]
    )
    opts = _options(given, parser).local_ckpt
    assert opts == LocalCkptOptions(
        base=str(base), every_n_steps=5, every_s=2.5, replicas=2, max_share=0.25, explicit=True
    )
    monkeypatch.delenv("PET_LOCAL_CKPT_EVERY_N_STEPS")
    parser = get_parser()
    off = _options(parser.parse_args(["--standalone", "--local-ckpt-dir=None", "x.py"]), parser)
    assert off.local_ckpt.base is None
    default = _options(parser.parse_args(["--standalone", "x.py"]), parser).local_ckpt
    assert (default.replicas, default.max_share, default.every_n_steps) == (1, 0.5, None)
    assert default.base in (contract.DEFAULT_BASE, None)  # None where /dev/shm is unusable
    assert "--local-ckpt-dir" in parser.format_help()


def test_a_spare_preloads_the_local_checkpoint_module_when_on(
    base: pathlib.Path, scripts_here: pathlib.Path
) -> None:
    import sys

    from nvrx.launcher._launch import _spare_pool
    from nvrx.launcher.cli import _options

    parser = get_parser()
    argv = ["--standalone", "--warm-spares", f"--local-ckpt-dir={base}", "x.py"]
    options = _options(parser.parse_args(argv), parser)
    options.command = [sys.executable, "x.py"]
    pool = _spare_pool(options)
    assert pool is not None
    assert SPARE_PRELOAD in pool._preload
    options.local_ckpt = LocalCkptOptions(base=None)
    pool = _spare_pool(options)
    assert pool is not None
    assert SPARE_PRELOAD not in pool._preload


# --- the node directory ------------------------------------------------------------------


def test_node_directory_life(base: pathlib.Path, clean_env: None) -> None:
    opts = LocalCkptOptions(base=str(base), every_n_steps=3, explicit=True)
    node = NodeDirectory.create(opts, "run/7")
    assert node is not None
    assert node.path.parent == base / f"nvrx-ckpt-{os.getuid()}"
    assert (node.path.stat().st_mode & 0o777) == 0o700
    settings = contract.LocalCkptSettings.from_env()
    assert settings == contract.LocalCkptSettings(node.path, "run/7", every_n_steps=3)
    # A second launcher of the user leaves the live directory alone.
    other = NodeDirectory.create(opts, "run/7")
    assert other is not None
    assert node.path.is_dir()
    assert other.path != node.path
    other.close(succeeded=False)  # left behind, its lock released
    node.close(succeeded=True)
    assert not node.path.exists()
    assert other.path.is_dir()
    assert contract.ENV_DIR not in os.environ
    third = NodeDirectory.create(opts, "run/8")  # removes the dead launcher's directory
    assert third is not None
    assert not other.path.exists()
    third.close(succeeded=True)
    assert NodeDirectory.create(LocalCkptOptions(base=None), "run/9") is None


def test_a_default_base_that_fails_turns_the_feature_off(
    base: pathlib.Path, clean_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    (base / f"nvrx-ckpt-{os.getuid()}").write_text("not a directory")
    with caplog.at_level("WARNING", logger="nvrx.launcher"):
        assert NodeDirectory.create(LocalCkptOptions(base=str(base)), "job") is None
    assert "local checkpoints are off" in caplog.text
    with pytest.raises(OSError, match="nvrx-ckpt"):
        NodeDirectory.create(LocalCkptOptions(base=str(base), explicit=True), "job")


# --- restore records ---------------------------------------------------------------------


def test_node_restore_takes_the_strongest_source_and_the_slowest_rank() -> None:
    assert node_restore([]) is None
    both = node_restore([_record(0, "own"), _record(1, "peer")])
    assert both is not None
    assert (both.source, both.iteration, both.snapshot_wall) == ("peer", 7, 100.0)
    assert both.restore_s == 0.5
    assert both.ranks == {0: "own", 1: "peer"}
    fallback = node_restore([_record(0, "global", iteration=None), _record(1, "own")])
    assert fallback is not None
    assert fallback.source == "global"


def test_restore_watch_journals_each_cycle_once(tmp_path: pathlib.Path) -> None:
    watch = RestoreWatch(tmp_path)
    assert watch.poll() is None  # no cycle yet
    watch.start_cycle(1, 2)
    contract.write_restore_record(tmp_path, _record(0, "own", cycle=0))  # an earlier cycle's
    assert watch.poll() is None
    contract.write_restore_record(tmp_path, _record(0, "own"))
    assert watch.poll() is None  # rank 1 has not written yet
    (tmp_path / "restore-1.json").write_text("{broken")
    contract.write_restore_record(tmp_path, _record(1, "peer"))
    got = watch.poll(final=True)
    assert got is not None
    assert got.ranks == {0: "own", 1: "peer"}
    assert watch.poll(final=True) is None  # once
    watch.start_cycle(2, 2)
    assert watch.poll(final=True) is None  # nothing of cycle 2: a script without them
    assert watch.poll(final=True) is None


def test_the_record_matches_the_schema(tmp_path: pathlib.Path) -> None:
    schema = json.loads(schema_path("journal").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    recorder = Recorder(JsonLines(tmp_path / "j", node="n"), JsonLines(None))
    recorder.record(CheckpointRestored(1, "peer", 7, 100.0, 0.5, {0: "own", 1: "peer"}))
    recorder.record(CheckpointRestored(2, "none", None, None, 0.0, {0: "none"}))
    lines = [json.loads(x) for x in (tmp_path / "j").read_text().splitlines()]
    for line in lines:
        validator.validate(line)
    assert not validator.is_valid({**lines[0], "source": "disk"})


# --- goodput -----------------------------------------------------------------------------


def _journal(restored: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One node: trains from 10 s, crashes at 70 s, restarts, first step at 80 s, ends at 100."""
    records: list[dict[str, Any]] = [
        {"event": "run_start", "t": 0.0, "node": "a"},
        {"event": "workers_started", "t": 5.0, "cycle": 0, "node": "a"},
        {"event": "first_step", "t": 10.0, "first_step": 10.0, "cycle": 0, "node": "a"},
        {"event": "progress", "t": 20.0, "saved": 20.0, "value": 10, "cycle": 0, "node": "a"},
        {"event": "rank_failed", "t": 70.0, "cycle": 0, "node": "a"},
        {"event": "decision", "t": 70.5, "action": "restart", "cycle": 0, "node": "a"},
        {"event": "workers_stopped", "t": 71.0, "workers_stopped": 71.0, "cycle": 0, "node": "a"},
        {"event": "restart", "t": 72.0, "from_cycle": 0, "cycle": 1, "node": "a"},
        {"event": "workers_started", "t": 72.0, "cycle": 1, "node": "a"},
    ]
    if restored is not None:
        records.append(
            {"event": "checkpoint_restored", "t": 79.0, "cycle": 1, "node": "a", **restored}
        )
    records += [
        {"event": "first_step", "t": 80.0, "first_step": 80.0, "cycle": 1, "node": "a"},
        {"event": "all_nodes_finished", "t": 99.0, "cycle": 1, "node": "a"},
        {"event": "finished", "t": 100.0, "node": "a"},
    ]
    return records


def test_recomputed_follows_the_restored_snapshot() -> None:
    disk = goodput.account(_journal(None))
    assert disk.seconds[goodput.Phase.RECOMPUTED] == pytest.approx(50.0)  # since the 20 s mark
    assert disk.restarts[0].restored_from is None
    snap = {"source": "own", "iteration": 59, "snapshot_wall": 69.0, "restore_s": 0.3}
    local = goodput.account(_journal(snap))
    assert local.seconds[goodput.Phase.RECOMPUTED] == pytest.approx(1.0)
    [cost] = local.restarts
    assert (cost.restored_from, cost.restored_iteration) == ("own", 59)
    assert "restored the local snapshot of iteration 59 from this node's memory" in local.format()
    fresh = goodput.account(_journal({"source": "none", "iteration": None, "snapshot_wall": None}))
    assert fresh.seconds[goodput.Phase.RECOMPUTED] == pytest.approx(60.0)  # all of cycle 0
    assert "restored nothing" in fresh.format()
    glob = goodput.account(_journal({"source": "global", "iteration": 10, "snapshot_wall": None}))
    assert glob.seconds[goodput.Phase.RECOMPUTED] == pytest.approx(50.0)  # the progress mark


def test_nodes_that_restored_from_different_places_merge() -> None:
    a = _journal({"source": "own", "iteration": 59, "snapshot_wall": 69.0})
    b = [
        {**r, "node": "b"}
        for r in _journal({"source": "peer", "iteration": 59, "snapshot_wall": 68.5})
    ]
    timeline = goodput.Timeline.from_records(a + b)
    again = goodput.Timeline.from_json(json.loads(json.dumps(timeline.to_json())))
    assert again == timeline
    cycle = timeline.cycles[1]
    assert (cycle.restored_from, cycle.restored_iteration, cycle.restored_t) == (
        "peer+own",
        59,
        68.5,
    )
    summary = goodput.account(timeline)
    assert "from a peer node's replica and this node's memory" in summary.format()
    assert summary.restarts[0].to_record()["restored_from"] == "peer+own"
    with pytest.raises(ValueError, match="restore source"):
        goodput.CycleTimes.from_json({"cycle": 1, "restored_from": "tape"})


# --- a real launcher ---------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_restart_journals_what_the_ranks_restored_and_a_success_removes_the_dir(
    start_launcher: Start, tmp_path: pathlib.Path, base: pathlib.Path, clean_env: None
) -> None:
    journal_path = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            *("--nproc-per-node", "2", "--max-restarts", "1", "--standalone"),
            f"--ft-journal={journal_path}",
            f"--local-ckpt-dir={base}",
            "--local-ckpt-every-n-steps=1",
        ],
        ["--steps", "6", "--fault", "sigkill:1:4:0", "--step-time", "0.3", "--restore-record"],
    )
    assert launcher.wait(150) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(x) for x in journal_path.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)
    restored = [r for r in records if r["event"] == "checkpoint_restored"]
    assert [(r["cycle"], r["source"]) for r in restored] == [(0, "none"), (1, "own")], restored
    assert restored[1]["ranks"] == {"0": "own", "1": "own"}
    assert restored[1]["iteration"] >= 2
    [cost] = [r for r in records if r["event"] == "restart_cost"]
    assert cost["restored_from"] == "own"
    assert cost["restored_iteration"] == restored[1]["iteration"]
    # Journalled before the cycle's first step (the cost line needs it).
    kinds = [r["event"] for r in records if r.get("cycle") == 1]
    assert kinds.index("checkpoint_restored") < kinds.index("first_step")
    # The job succeeded: nothing of it is left in the base directory.
    assert list((base / f"nvrx-ckpt-{os.getuid()}").iterdir()) == []
