"""--ft-install-exception-hook through ft_launcher: a raising rank exits at once."""

from __future__ import annotations

import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from launcher_testkit import FAST_FT, Launcher  # type: ignore[import-not-found]

SCRIPT = pathlib.Path(__file__).with_name("exception_hook_script.py")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_rank_that_raises_exits_despite_a_live_non_daemon_thread(
    tmp_path: pathlib.Path,
) -> None:
    launcher = Launcher(
        [
            *FAST_FT,
            "--standalone",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            "--ft-install-exception-hook",
            "true",
            str(SCRIPT),
        ],
        tmp_path,
        tmp_path / "launcher.log",
    )
    try:
        start = time.monotonic()
        code = launcher.wait(120)
        took = time.monotonic() - start
        log = launcher.log()
        assert code == 1, log[-3000:]
        assert "raising now" in log
        assert "uncaught exception; exiting" in log
        assert "RuntimeError: boom from the exception hook test" in log
        # The sleeping thread would have held the rank for 600 s.
        assert took < 100, f"took {took:.0f} s"
    finally:
        launcher.kill_tree()
