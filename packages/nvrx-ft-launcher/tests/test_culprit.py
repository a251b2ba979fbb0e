"""find_culprit rule by rule, on hand-made evidence (the real hang is test_culprit_real)."""

from __future__ import annotations

import pytest

from nvrx.ft import StackSummary
from nvrx.ft._events import RankTerminated, encode_event, parse_event
from nvrx.launcher._culprit import Basis, RankEvidence, find_culprit

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000.0
USER = StackSummary(None, "train.py:53", "step")
ALL_REDUCE = StackSummary("all_reduce", "train.py:40", "step")
BARRIER = StackSummary("barrier", "train.py:44", "step")


def ev(
    rank: int, wall: float = T0, stack: StackSummary | None = None, hb: float = 8.0
) -> RankEvidence:
    return RankEvidence(rank, "heartbeat_timeout", wall, hb, hb, stack)


def test_one_rank_outside_while_the_others_wait_in_all_reduce() -> None:
    found = find_culprit(
        [
            ev(0, stack=ALL_REDUCE),
            ev(1, stack=USER),
            ev(2, stack=ALL_REDUCE),
            ev(3, stack=ALL_REDUCE),
        ],
        world_size=4,
    )
    assert (found.culprit, found.victims, found.basis) == (1, (0, 2, 3), (Basis.STACK,))
    assert found.sentence == (
        "rank 1: last heartbeat 8.0 s ago, stack in train.py:53; "
        "ranks 0, 2, 3: blocked in all_reduce; "
        "ranks 0, 2, 3 wait in all_reduce while rank 1 is at train.py:53 (step)"
    )
    assert found.to_json()["culprit"] == 1
    assert found.collective == {"op": "all_reduce", "group": None, "seq": None}
    assert found.culprit_frame == "at train.py:53 (step)"


def test_stack_and_timing_agree() -> None:
    found = find_culprit([ev(0, T0 + 5, ALL_REDUCE), ev(1, T0, USER)])
    assert found.culprit == 1
    assert found.basis == (Basis.STACK, Basis.TIMING)


def test_timing_alone_decides_without_stacks() -> None:
    found = find_culprit([ev(0, T0 + 3), ev(1, T0), ev(2, T0 + 2.5)], min_margin_s=2.0)
    assert (found.culprit, found.basis) == (1, (Basis.TIMING,))
    assert "no stack" in found.sentence


def test_timing_below_the_margin_is_undecided() -> None:
    found = find_culprit([ev(0, T0 + 1.9), ev(1, T0)], min_margin_s=2.0)
    assert not found.decided
    assert found.sentence.startswith("culprit undecided (")


def test_every_rank_in_a_collective_is_undecided() -> None:
    found = find_culprit([ev(0, stack=ALL_REDUCE), ev(1, stack=BARRIER)])
    assert (found.culprit, found.reason) == (None, "every rank is blocked in a collective")
    assert "rank 0: blocked in all_reduce; rank 1: blocked in barrier" in found.sentence


def test_two_ranks_outside_is_undecided() -> None:
    found = find_culprit([ev(0, stack=USER), ev(1, stack=USER), ev(2, stack=ALL_REDUCE)])
    assert not found.decided
    assert "ranks 0, 1 are outside a collective" in found.reason


def test_a_rank_without_stack_keeps_the_stack_rule_from_deciding() -> None:
    assert not find_culprit([ev(0, stack=ALL_REDUCE), ev(1, stack=USER), ev(2)]).decided


def test_missing_rank_of_the_world_is_undecided() -> None:
    found = find_culprit([ev(0, stack=ALL_REDUCE), ev(1, stack=USER)], world_size=3)
    assert (found.culprit, found.reason) == (None, "no evidence from rank 2")


def test_stack_and_timing_disagree_is_undecided() -> None:
    found = find_culprit([ev(0, T0, ALL_REDUCE), ev(1, T0 + 5, USER), ev(2, T0 + 5, ALL_REDUCE)])
    assert not found.decided
    assert "stacks point at rank 1, the heartbeat times at rank 0" in found.reason


def test_stack_culprit_that_went_stale_last_is_undecided() -> None:
    found = find_culprit([ev(0, T0, ALL_REDUCE), ev(1, T0 + 5, USER), ev(2, T0 + 0.5, ALL_REDUCE)])
    assert not found.decided


def test_timing_culprit_blocked_in_collective_while_another_is_not_is_undecided() -> None:
    found = find_culprit([ev(0, T0, ALL_REDUCE), ev(1, T0 + 5, USER), ev(2, T0 + 5)])
    assert not found.decided


def test_single_rank_job_and_single_evidence() -> None:
    assert find_culprit([ev(0, stack=USER)], world_size=1).culprit == 0
    assert not find_culprit([ev(0, stack=USER)]).decided
    assert not find_culprit([]).decided


def test_first_evidence_of_a_rank_counts() -> None:
    found = find_culprit([ev(0, stack=ALL_REDUCE), ev(1, stack=USER), ev(1, stack=ALL_REDUCE)])
    assert found.culprit == 1


@pytest.mark.parametrize("cause", ["gpu_health", "nic_health"])
def test_health_terminations_are_not_hang_evidence(cause: str) -> None:
    event = RankTerminated(local_rank=0, rank=0, pid=1, cause=cause, message="x")
    assert RankEvidence.from_event(event) is None


def test_evidence_from_a_parsed_event() -> None:
    sent = RankTerminated(
        local_rank=0,
        rank=3,
        pid=99,
        cause="heartbeat_timeout",
        message="m",
        last_activity_s=8.0,
        last_activity_wall=T0,
        last_heartbeat_s=8.0,
        open_sections=("step",),
        stack=USER,
    )
    parsed = parse_event(encode_event(sent))
    assert isinstance(parsed, RankTerminated)
    got = RankEvidence.from_event(parsed)
    assert got == RankEvidence(3, "heartbeat_timeout", T0, 8.0, 8.0, USER)


def _stopped(
    rank: int, state: str, wall: float = T0, stack: StackSummary | None = None
) -> RankEvidence:
    return RankEvidence(rank, "heartbeat_timeout", wall, 8.0, 8.0, stack, proc_state=state)


def test_a_rank_stopped_by_a_signal_is_the_culprit() -> None:
    """SIGSTOP (the demo's SimulatedFault hang): no stack, no timing margin, state T."""
    found = find_culprit(
        [_stopped(0, "S", stack=ALL_REDUCE), _stopped(1, "T"), _stopped(2, "R", stack=ALL_REDUCE)],
        world_size=3,
    )
    assert (found.culprit, found.victims, found.basis) == (1, (0, 2), (Basis.STOPPED,))
    assert found.sentence.startswith("rank 1: stopped by a signal (state T), last heartbeat")
    assert found.to_json()["basis"] == ["stopped"]
    # Without the state the same evidence is undecided (a stack is missing, no margin).
    plain = [_stopped(0, "S", stack=ALL_REDUCE), ev(1), _stopped(2, "R", stack=ALL_REDUCE)]
    assert find_culprit(plain, world_size=3).culprit is None


def test_two_stopped_ranks_fall_back_to_the_other_rules() -> None:
    found = find_culprit([_stopped(0, "T"), _stopped(1, "T")], world_size=2)
    assert found.culprit is None


def test_a_stopped_rank_decides_even_when_a_peer_left_no_evidence() -> None:
    """Peers whose collective failed when the stopped rank was killed exit unreported."""
    found = find_culprit([_stopped(0, "T"), ev(1, stack=ALL_REDUCE)], world_size=3)
    assert (found.culprit, found.victims, found.basis) == (0, (1,), (Basis.STOPPED,))
    # Alone it decides only in a one-rank world.
    assert find_culprit([_stopped(0, "T")], world_size=3).culprit is None
    assert find_culprit([_stopped(0, "T")], world_size=1).culprit == 0


def test_the_process_state_comes_from_the_event() -> None:
    sent = RankTerminated(
        local_rank=0, rank=3, pid=99, cause="heartbeat_timeout", message="m", proc_state="T"
    )
    parsed = parse_event(encode_event(sent))
    assert isinstance(parsed, RankTerminated)
    got = RankEvidence.from_event(parsed)
    assert got is not None
    assert got.proc_state == "T"
