"""What ends a cycle: one table row per rule of :func:`cycle_end`'s precedence."""

from __future__ import annotations

import pytest

from nvrx.launcher._cycle_end import End, Seen, Workers, cycle_end

EVERYTHING = Seen(
    decided=True,
    shutdown_requested=True,
    exclude_requested=True,
    workers=Workers.FAILED,
    watched_monitor_died=True,
    nodes_waiting=3,
)


@pytest.mark.parametrize(
    ("seen", "end"),
    [
        # 0. nothing happened: the cycle goes on.
        (Seen(), None),
        (Seen(workers=Workers.HEALTHY, nodes_waiting=0), None),
        # 1. a published decision wins over everything else seen in the tick.
        (EVERYTHING, End.FOLLOW),
        (Seen(decided=True, workers=Workers.SUCCEEDED), End.FOLLOW),
        # 2. a ShutdownWorkload request wins over an exclusion and any failure.
        (Seen(shutdown_requested=True, exclude_requested=True), End.SHUTDOWN_REQUEST),
        (Seen(shutdown_requested=True, workers=Workers.UNINTERRUPTIBLE), End.SHUTDOWN_REQUEST),
        # 3. an ExcludeThisNode request wins over failures and the D-state check.
        (Seen(exclude_requested=True, workers=Workers.FAILED), End.EXCLUDE_REQUEST),
        (Seen(exclude_requested=True, workers=Workers.UNINTERRUPTIBLE), End.EXCLUDE_REQUEST),
        # 4. torch's D-state check wins over failures and dead monitors.
        (Seen(workers=Workers.UNINTERRUPTIBLE, watched_monitor_died=True), End.UNINTERRUPTIBLE),
        # 5. a failure: a failed rank, torch's pid mismatch, a watched rank's dead monitor.
        (Seen(workers=Workers.FAILED), End.FAILURE),
        (Seen(workers=Workers.PIDS_MISMATCH), End.FAILURE),
        (Seen(watched_monitor_died=True), End.FAILURE),
        (Seen(workers=Workers.SUCCEEDED, watched_monitor_died=True), End.FAILURE),
        (Seen(workers=Workers.FAILED, nodes_waiting=2), End.FAILURE),
        # 6. success, unless a monitor of a watched rank died in the same tick.
        (Seen(workers=Workers.SUCCEEDED), End.SUCCESS),
        (Seen(workers=Workers.SUCCEEDED, nodes_waiting=2), End.SUCCESS),
        # 7. nodes waiting to join, only when nothing else happened.
        (Seen(nodes_waiting=1), End.NODES_WAITING),
    ],
)
def test_cycle_end_rule_by_rule(seen: Seen, end: End | None) -> None:
    assert cycle_end(seen) is end


def test_the_precedence_is_written_in_the_docstring_in_rule_order() -> None:
    doc = cycle_end.__doc__ or ""
    order = [doc.index(f"``{end.name}``") for end in End]
    assert order == sorted(order)
