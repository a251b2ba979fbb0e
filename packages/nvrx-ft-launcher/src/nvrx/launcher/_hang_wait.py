"""After a hang's first report, the short wait for the other local ranks' reports.

The culprit exits on its monitor's signal right after its report, while each victim's
report follows its own stack dump pause; deciding on the culprit's alone would leave the
victims unseen (:mod:`._culprit` tells the culprit from its victims by their reports).
The wait is bounded on the monotonic clock, so a wall-clock step does not stretch it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from nvrx.ft._termination import STACK_DUMP_PAUSE_S

from ._cycle_state import CycleState
from ._failure_report import hang_evidence

__all__: list[str] = []

#: How long after a hang's first report to wait for the other local ranks' reports
#: (each follows its stack dump pause).
HANG_EVIDENCE_WAIT_S = STACK_DUMP_PAUSE_S + 1.0
#: The longest single wait in between (the ranks' exits are polled).
_POLL_S = 0.05


def await_hang_evidence(
    cycle: CycleState,
    handlers: Mapping[int, SubprocessHandler],
    *,
    wait: Callable[[float], None],
    drain: Callable[[], object],
) -> bool:
    """Wait until every local rank reported or exited, at most :data:`HANG_EVIDENCE_WAIT_S`
    after the first report; ``drain`` takes in the monitors' events after each ``wait``.

    Returns whether it waited (False: no hang report in ``cycle``).
    """
    if not hang_evidence(cycle) or cycle.first_report_mono is None:
        return False
    deadline = cycle.first_report_mono + HANG_EVIDENCE_WAIT_S
    while True:
        exited = {r for r, h in handlers.items() if h.proc.poll() is not None}
        if all(r in cycle.terminated or r in exited for r in handlers):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        wait(min(left, _POLL_S))
        drain()
