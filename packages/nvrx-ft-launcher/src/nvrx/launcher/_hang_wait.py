"""After a hang's first report: the short wait for the other local ranks' reports, and
the attribution as soon as they are in.

The culprit exits on its monitor's signal right after its report, while each victim's
report follows its own stack dump pause; deciding on the culprit's alone would leave the
victims unseen (:mod:`._culprit` tells the culprit from its victims by their reports).
The evidence is in once every local rank has reported or exited, or
:data:`HANG_EVIDENCE_WAIT_S` after the first report. The agent's tick attributes the
hang then (:func:`attribute_when_in`), without waiting for the ranks to exit: ranks
that handle SIGTERM (Lightning, NeMo) live on until the monitors' SIGKILL at the end of
the termination grace period, seconds later. When a rank fails before the evidence is
in, the failure waits for it (:func:`await_hang_evidence`). The wait is bounded on the
monotonic clock, so a wall-clock step does not stretch it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from torch.distributed.elastic.agent.server.api import WorkerGroup
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from nvrx.ft._termination import STACK_DUMP_PAUSE_S

from ._cycle_state import CycleState
from ._events import Recorder
from ._failure_report import attribute_hang, hang_evidence

__all__: list[str] = []

#: How long after a hang's first report to wait for the other local ranks' reports
#: (each follows its stack dump pause).
HANG_EVIDENCE_WAIT_S = STACK_DUMP_PAUSE_S + 1.0
#: The longest single wait in between (the ranks' exits are polled).
_POLL_S = 0.05


def _deadline(cycle: CycleState) -> float | None:
    """When the wait for the cycle's hang evidence ends (monotonic); None: no hang report."""
    if cycle.first_report_mono is None or not hang_evidence(cycle):
        return None
    return cycle.first_report_mono + HANG_EVIDENCE_WAIT_S


def _all_reported(cycle: CycleState, handlers: Mapping[int, SubprocessHandler]) -> bool:
    """Every local rank reported or exited."""
    exited = {r for r, h in handlers.items() if h.proc.poll() is not None}
    return all(r in cycle.terminated or r in exited for r in handlers)


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
    deadline = _deadline(cycle)
    if deadline is None:
        return False
    while True:
        if cycle.hang_attributed or _all_reported(cycle, handlers):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        wait(min(left, _POLL_S))
        drain()


def attribute_when_in(
    cycle: CycleState,
    handlers: Mapping[int, SubprocessHandler],
    wg: WorkerGroup,
    recorder: Recorder,
) -> bool:
    """Attribute the cycle's hang (:func:`._failure_report.attribute_hang`) once its
    evidence is in, whether or not the ranks have exited; never waits.

    Returns whether it attributed now (False: no hang report, already attributed, or
    the evidence still coming).
    """
    if cycle.hang_attributed:
        return False
    deadline = _deadline(cycle)
    if deadline is None:
        return False
    if not _all_reported(cycle, handlers) and time.monotonic() < deadline:
        return False
    return attribute_hang(cycle, wg, recorder) is not None


def tick_wait_s(cycle: CycleState, interval: float) -> float:
    """How long the agent's loop may wait for its next tick: ``interval``, shorter while
    a hang's evidence wait ends sooner (so the attribution is not an interval late)."""
    deadline = None if cycle.hang_attributed else _deadline(cycle)
    if deadline is None:
        return interval
    return max(0.0, min(interval, deadline - time.monotonic()))
