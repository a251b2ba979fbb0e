"""find_culprit's collective and desync rules, and what a finding says the others wait in.

Table-tested on hand-made evidence; the real hangs are in test_collective_real and
benchmarks/bench_culprit.py.
"""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import pytest

from nvrx.ft import StackSummary
from nvrx.ft._events import RankTerminated, encode_event, parse_event
from nvrx.ft._flight import CollectiveState, summarize_trace
from nvrx.launcher._culprit import Basis, RankEvidence, find_culprit
from nvrx.launcher._events import HangAttributed
from nvrx.launcher.journal import schema_path

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000.0
SLEEP = StackSummary(None, "train.py:53", "step")
AR = StackSummary("all_reduce", "train.py:40", "step")
BC = StackSummary("broadcast", "train.py:41", "step")
AR5 = CollectiveState("all_reduce", "default_pg", 5, pending=True)
AR4_DONE = CollectiveState("all_reduce", "default_pg", 4, pending=False)
AR5_DONE = CollectiveState("all_reduce", "default_pg", 5, pending=False)
BC5 = CollectiveState("broadcast", "default_pg", 5, pending=True)
WAIT5 = {"op": "all_reduce", "group": "default_pg", "seq": 5}
WAIT_OP = {"op": "all_reduce", "group": None, "seq": None}

S = StackSummary | None
C = CollectiveState | None


def evs(
    *ranks: tuple[S, C], state: str = "S", stale_first: int | None = None
) -> list[RankEvidence]:
    """Evidence of ranks 0, 1, ...; ``state`` is rank 1's /proc state (the others': S)."""
    return [
        RankEvidence(
            r,
            "heartbeat_timeout",
            T0 - (5.0 if r == stale_first else 0.0),
            8.0,
            8.0,
            stack,
            state if r == 1 else "S",
            coll,
        )
        for r, (stack, coll) in enumerate(ranks)
    ]


# (name, evidence, culprit, basis, collective, culprit_frame)
CASES = [
    (
        "sleeping rank behind, flight recorder and stack agree",
        evs((AR, AR5), (SLEEP, AR4_DONE), (AR, AR5), (AR, AR5)),
        1,
        (Basis.COLLECTIVE, Basis.STACK),
        WAIT5,
        "at train.py:53 (step)",
    ),
    (
        "behind by the flight recorder, no stacks",
        evs((None, AR5), (None, AR4_DONE)),
        1,
        (Basis.COLLECTIVE,),
        WAIT5,
        None,
    ),
    (
        "desync of four by the flight recorder",
        evs((AR, AR5), (AR, AR5), (BC, BC5), (AR, AR5)),
        2,
        (Basis.COLLECTIVE,),
        WAIT5,
        "in broadcast #5 on default_pg at train.py:41 (step)",
    ),
    (
        "desync of two is undecided (no majority)",
        evs((AR, AR5), (BC, BC5)),
        None,
        (),
        None,
        None,
    ),
    (
        "desync of four by the stacks alone",
        evs((AR, None), (BC, None), (AR, None), (AR, None)),
        1,
        (Basis.STACK,),
        WAIT_OP,
        "in broadcast at train.py:41 (step)",
    ),
    (
        "a rank that finished the waited collective is not behind",
        evs((None, AR5), (None, AR5_DONE)),
        None,
        (),
        WAIT5,
        None,
    ),
    (
        "flight recorder and stacks disagree: undecided",
        evs((SLEEP, AR5), (AR, AR4_DONE), (AR, AR5)),
        None,
        (),
        WAIT5,
        None,
    ),
    (
        "stopped rank: its recorder unread, the others' name the collective",
        evs((AR, AR5), (None, None), (AR, AR5), state="T"),
        1,
        (Basis.STOPPED,),
        WAIT5,
        "stopped by a signal",
    ),
    (
        "stack rule, victims' collective from their recorders",
        evs((AR, AR5), (SLEEP, None), (AR, AR5)),
        1,
        (Basis.STACK,),
        WAIT5,
        "at train.py:53 (step)",
    ),
    (
        "two ranks behind: undecided, the waited collective still named",
        evs((AR, AR5), (SLEEP, AR4_DONE), (SLEEP, AR4_DONE), (AR, AR5)),
        None,
        (),
        WAIT5,
        None,
    ),
    (
        "blocked in the kernel (state D, no stack), no flight recorder",
        evs((AR, None), (None, None), (AR, None), (AR, None), state="D"),
        1,
        (Basis.BLOCKED,),
        WAIT_OP,
        "blocked in the kernel",
    ),
    (
        "blocked in the kernel, the flight recorders agree",
        evs((AR, AR5), (None, AR4_DONE), (AR, AR5), (AR, AR5), state="D"),
        1,
        (Basis.COLLECTIVE, Basis.BLOCKED),
        WAIT5,
        "blocked in the kernel",
    ),
    (
        "blocked in the kernel and stale first by the margin",
        evs((AR, None), (None, None), (AR, None), state="D", stale_first=1),
        1,
        (Basis.BLOCKED, Basis.TIMING),
        WAIT_OP,
        "blocked in the kernel",
    ),
    (
        "state D inside the waited collective is a victim: undecided",
        evs((AR, AR5), (None, AR5), (AR, AR5), state="D"),
        None,
        (),
        WAIT5,
        None,
    ),
    (
        "state D inside another collective: the desync rule's, not the blocked rule's",
        evs((AR, AR5), (None, BC5), (AR, AR5), (AR, AR5), state="D"),
        1,
        (Basis.COLLECTIVE,),
        WAIT5,
        "blocked in the kernel in broadcast #5 on default_pg",
    ),
    (
        "state D while another rank is outside a collective: undecided",
        evs((SLEEP, None), (None, None), (AR, None), (AR, None), state="D"),
        None,
        (),
        WAIT_OP,
        None,
    ),
    (
        "state D while the others are in two operations: undecided",
        evs((AR, None), (None, None), (BC, None), (AR, None), state="D"),
        None,
        (),
        WAIT_OP,
        None,
    ),
    (
        "state D against the heartbeat times: undecided",
        evs((AR, None), (None, None), (AR, None), (AR, None), state="D", stale_first=2),
        None,
        (),
        WAIT_OP,
        None,
    ),
    (
        "state D with a stack is not the blocked rule's",
        evs((AR, None), (AR, None), (AR, None), state="D"),
        None,
        (),
        WAIT_OP,
        None,
    ),
]


@pytest.mark.parametrize(
    ("evidence", "culprit", "basis", "collective", "frame"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_collective_rules(
    evidence: list[RankEvidence],
    culprit: int | None,
    basis: tuple[Basis, ...],
    collective: dict[str, object] | None,
    frame: str | None,
) -> None:
    found = find_culprit(evidence, world_size=len(evidence))
    assert (found.culprit, found.basis) == (culprit, basis), found
    assert found.collective == collective
    assert found.culprit_frame == frame
    if culprit is not None:
        assert culprit not in found.victims
        if collective is not None:
            waited = (
                collective["op"] if collective["seq"] is None else "all_reduce #5 on default_pg"
            )
            verb = "wait" if len(found.victims) > 1 else "waits"
            assert f"{verb} in {waited}" in found.sentence
    elif collective is not None:
        assert "waited collective: all_reduce" in found.sentence


def test_the_finding_validates_against_the_journal_schema() -> None:
    found = find_culprit(evs((AR, AR5), (SLEEP, AR4_DONE)), world_size=2)
    record = HangAttributed(cycle=0, **found.to_json()).to_record()
    record |= {"schema_version": 1, "t": T0, "node": "n0"}
    schema = json.loads(schema_path("journal").read_text())
    jsonschema.Draft202012Validator(schema).validate(record)
    assert record["collective"] == WAIT5
    assert record["culprit_frame"] == "at train.py:53 (step)"


def test_a_blocked_finding_validates_against_the_journal_schema() -> None:
    found = find_culprit(evs((AR, None), (None, None), (AR, None), state="D"), world_size=3)
    assert found.culprit == 1
    record = HangAttributed(cycle=0, **found.to_json()).to_record()
    record |= {"schema_version": 1, "t": T0, "node": "n0"}
    schema = json.loads(schema_path("journal").read_text())
    jsonschema.Draft202012Validator(schema).validate(record)
    assert record["basis"] == ["blocked"]
    assert record["sentence"] == (
        "rank 1: blocked in the kernel (state D), last heartbeat 8.0 s ago, no stack; "
        "ranks 0, 2: blocked in all_reduce; ranks 0, 2 wait in all_reduce while rank 1 is "
        "blocked in the kernel"
    )


def test_the_collective_state_travels_in_the_monitor_event() -> None:
    event = RankTerminated(
        local_rank=0,
        rank=3,
        pid=1234,
        cause="heartbeat_timeout",
        message="hb",
        collective=AR5,
        stack=AR,
    )
    parsed = parse_event(encode_event(event))
    assert isinstance(parsed, RankTerminated)
    assert parsed.collective == AR5
    ev = RankEvidence.from_event(parsed)
    assert ev is not None
    assert ev.collective == AR5
    bad = json.loads(encode_event(event))
    bad["collective"]["seq"] = "five"
    with pytest.raises(ValueError, match="seq"):
        parse_event(json.dumps(bad).encode())


def _entry(rid: int, name: str, seq: int, retired: bool, **extra: object) -> dict[str, object]:
    return {
        "record_id": rid,
        "profiling_name": name,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "process_group": ["0", "default_pg"],
        "retired": retired,
        **extra,
    }


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], None),
        (
            [_entry(0, "gloo:all_reduce", 1, True)],
            CollectiveState("all_reduce", "default_pg", 1, False),
        ),
        (
            [_entry(1, "gloo:all_reduce", 2, False), _entry(0, "gloo:all_reduce", 1, True)],
            CollectiveState("all_reduce", "default_pg", 2, True),
        ),
        (
            [_entry(3, "nccl:broadcast", 4, False), _entry(4, "nccl:all_reduce", 5, True)],
            CollectiveState("broadcast", "default_pg", 4, True),
        ),
        (
            [_entry(0, "gloo:send", 0, False, is_p2p=True, p2p_seq_id=7, process_group=["3", ""])],
            CollectiveState("send", "group 3", 7, True),
        ),
        (
            [_entry(0, "gloo:broadcast", 1, False, process_group=["1", "undefined"])],
            CollectiveState("broadcast", "group 1", 1, True),
        ),
    ],
)
def test_summarize_trace(
    entries: list[dict[str, object]], expected: CollectiveState | None
) -> None:
    assert summarize_trace(json.dumps({"version": "2.10", "entries": entries})) == expected


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"entries": 3}', b"\xff"])
def test_summarize_trace_of_garbage_is_none(data: bytes) -> None:
    assert summarize_trace(data) is None
