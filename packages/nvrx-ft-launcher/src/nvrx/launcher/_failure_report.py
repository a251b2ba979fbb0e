"""What the agent says about a failed cycle: crash lines, the hang's culprit, the records.

Functions of the cycle's state (:class:`._cycle_state.CycleState`) and torch's result,
called by the agent when a cycle ends on a failure: each crashed rank named at once
(:func:`name_crashes`), the failures described for the decision's reason
(:func:`describe_failures`), each failed rank journalled with its root cause
(:func:`journal_failures`), and a hang's culprit named from the monitors' evidence
(:func:`attribute_hang`); :func:`report_failures` does the last three in their order.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup

from nvrx.ft._events import RankTerminated

from ._culprit import CulpritFinding, RankEvidence, find_culprit
from ._cycle_state import CycleState
from ._deterministic import RankOutcome
from ._events import HangAttributed, RankFailed, Recorder
from ._root_cause import root_cause

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by signal {_signal_name(-exitcode)}"
    return f"exited with code {exitcode}"


def _describe_termination(event: RankTerminated) -> str:
    parts = [f"its monitor terminated it: {event.cause}"]
    if event.section:
        parts.append(f"section {event.section!r}")
    if event.observed_s is not None and event.limit_s is not None:
        parts.append(f"{event.observed_s:.2f} s > limit {event.limit_s:.2f} s")
    return ", ".join(parts)


def hang_evidence(cycle: CycleState) -> list[RankEvidence]:
    """The monitors' reports of the cycle's hung ranks, as the culprit rules read them."""
    found = (RankEvidence.from_event(e) for e in cycle.terminated.values())
    return [e for e in found if e is not None]


def attribute_hang(cycle: CycleState, wg: WorkerGroup, recorder: Recorder) -> CulpritFinding | None:
    """Name the hung rank of this cycle (or say why not); journaled and logged once.

    The first call with evidence decides (:mod:`._hang_wait` calls it as soon as the
    evidence is in, before the ranks exit); later calls return that finding.
    """
    if cycle.hang_attributed:
        return cycle.hang_finding
    evidence = hang_evidence(cycle)
    if not evidence:
        return None
    world = wg.workers[0].world_size if wg.workers else None
    single_node = world is not None and wg.spec.local_world_size == world
    finding = find_culprit(evidence, world_size=world if single_node else None)
    cycle.hang_attributed, cycle.hang_finding = True, finding
    recorder.record(HangAttributed(cycle=cycle.number, **finding.to_json()))
    return finding


def name_crashes(cycle: CycleState, result: RunResult) -> None:
    """Log each crashed rank the moment it is seen, before the others are stopped.

    The decision's line (restart or stop) follows only once the survivors have
    stopped (up to --workers-stop-timeout); this one names the rank at once, as
    torchrun's ``exitcode`` line does. A rank its monitor terminated (a hang) is
    named by the hang line instead.
    """
    for global_rank, failure in sorted(result.failures.items()):
        if failure.local_rank in cycle.terminated:
            continue
        if failure.pid in cycle.crashes_named:
            continue
        cycle.crashes_named.add(failure.pid)
        logger.error(
            "rank %d (local rank %d, pid %d) %s in cycle %d; stopping the other ranks",
            global_rank,
            failure.local_rank,
            failure.pid,
            _describe_exit(failure.exitcode),
            cycle.number,
        )


def describe_failures(cycle: CycleState, result: RunResult) -> list[str]:
    """One phrase per failed or terminated rank, for the decision's reason."""
    out = []
    for global_rank, failure in sorted(result.failures.items()):
        text = f"rank {global_rank} (local rank {failure.local_rank}, pid {failure.pid}) "
        text += _describe_exit(failure.exitcode)
        event = cycle.terminated.get(failure.local_rank)
        if event is not None:
            text += "; " + _describe_termination(event)
        out.append(text)
    failed = {f.local_rank for f in result.failures.values()}
    for local_rank, event in sorted(cycle.terminated.items()):
        if local_rank not in failed:
            out.append(
                f"rank {event.rank} (local rank {local_rank}, pid {event.pid}) is being "
                f"stopped; {_describe_termination(event)}"
            )
    return out


def journal_failures(
    cycle: CycleState, result: RunResult, stderrs: Mapping[int, Any], recorder: Recorder
) -> list[RankOutcome]:
    """Journal each failed rank with its root cause (logged); their outcomes."""
    outcomes = []
    for global_rank, failure in sorted(result.failures.items()):
        event = cycle.terminated.get(failure.local_rank)
        code = failure.exitcode
        cause = root_cause(failure, stderrs.get(failure.local_rank))
        outcomes.append(
            RankOutcome(
                rank=global_rank,
                exitcode=code,
                terminated_by_monitor=event is not None,
                traceback=None if cause is None else cause.traceback,
                message=None if cause is None else cause.message,
            )
        )
        if cause is not None:
            logger.error(
                "root cause of rank %d (local rank %d) failing, from its %s:\n%s",
                global_rank,
                failure.local_rank,
                "error file (@record)" if cause.source == "error_file" else "stderr",
                cause.traceback or cause.message,
            )
        recorder.record(
            RankFailed(
                cycle=cycle.number,
                rank=global_rank,
                local_rank=failure.local_rank,
                pid=failure.pid,
                exit_code=code if code >= 0 else None,
                signal=_signal_name(-code) if code < 0 else None,
                monitor_cause=event.cause if event else None,
                section=event.section if event else None,
                observed_s=event.observed_s if event else None,
                limit_s=event.limit_s if event else None,
                root_cause=None if cause is None else cause.to_json(),
            )
        )
    return outcomes


def report_failures(
    cycle: CycleState,
    result: RunResult,
    wg: WorkerGroup,
    stderrs: Mapping[int, Any],
    recorder: Recorder,
    *,
    causes: Sequence[str] = (),
) -> tuple[list[str], list[RankOutcome]]:
    """A failed cycle's report: the hang attributed, each failed rank journalled.

    Returns the decision's causes (the hang's culprit first, then ``causes``, then one
    phrase per failed or terminated rank) and the failed ranks' outcomes.
    """
    finding = attribute_hang(cycle, wg, recorder)
    hang = [] if finding is None else ["hang: " + finding.sentence]
    described = [*hang, *causes, *describe_failures(cycle, result)]
    return described, journal_failures(cycle, result, stderrs, recorder)
