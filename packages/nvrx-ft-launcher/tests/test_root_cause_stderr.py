"""Which line of a redirected stderr tail is the failure's message (no processes)."""

from __future__ import annotations

import pathlib

import pytest

from nvrx.launcher._root_cause import process_failure, root_cause

_TRACE = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "    step()",
    "    ^^^^^^",
    "RuntimeError: injected failure at step 3",
]
_SHUTDOWN = "[rank1]:[W1203 11:51:53.009777203 WorkerServer.cpp:139] [c10d] Server exited"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (_TRACE, "RuntimeError: injected failure at step 3"),
        # torch's shutdown log line after the traceback is not the message
        ([*_TRACE, _SHUTDOWN], "RuntimeError: injected failure at step 3"),
        ([*_TRACE, "[W1203 11:51:53.009 socket.cpp:469] [c10d] poll"], _TRACE[-1]),
        # chained exceptions: the last traceback's exception
        (
            [
                *_TRACE,
                "",
                "During handling of the above exception, another exception occurred:",
                "",
                "Traceback (most recent call last):",
                '  File "x.py", line 1',
                "OSError: disk",
            ],
            "OSError: disk",
        ),
        # no traceback: the last line that is not torch's own log line
        (["killed by the OOM handler", _SHUTDOWN], "killed by the OOM handler"),
        (["only a line"], "only a line"),
        ([_SHUTDOWN], _SHUTDOWN),
    ],
)
def test_the_message_is_the_exception_line_not_a_shutdown_log_line(
    tmp_path: pathlib.Path, lines: list[str], message: str
) -> None:
    stderr = tmp_path / "stderr.log"
    stderr.write_text("\n".join(lines) + "\n")
    found = root_cause(process_failure(1, 123, 1, "<N/A>"), str(stderr))
    assert found is not None
    assert found.source == "stderr"
    assert found.message == message
    assert found.traceback is not None
    assert found.traceback.endswith(lines[-1])
