"""The monitor events' contract, one type per kind: the wire bytes do not change.

``nvrx.ft._events`` is read by the same code on both sides: the monitor encodes a typed
event, the launcher parses the datagram into that type. The bytes below are what the
monitors of earlier releases sent (the flat ``MonitorEvent`` encoding, kept as the
public view), so a launcher and a monitor of either kind still agree.
"""

from __future__ import annotations

import dataclasses

import pytest

from nvrx.ft import MonitorEvent, StackSummary, parse_monitor_event
from nvrx.ft._events import (
    EVENT_KINDS,
    MAX_EVENT_BYTES,
    RankConnected,
    RankDisconnected,
    RankEvent,
    RankFirstStep,
    RankTerminated,
    WorkloadRequest,
    encode_event,
    parse_event,
)
from nvrx.ft._flight import CollectiveState

WIRE: list[tuple[RankEvent, bytes]] = [
    (
        RankConnected(local_rank=1, rank=9, pid=1234),
        b'{"event":"rank_connected","local_rank":1,"rank":9,"pid":1234,"v":1}',
    ),
    (
        RankDisconnected(local_rank=0, rank=0, pid=7),
        b'{"event":"rank_disconnected","local_rank":0,"rank":0,"pid":7,"v":1}',
    ),
    (
        RankTerminated(
            local_rank=1,
            rank=9,
            pid=1234,
            cause="section_timeout",
            section="step",
            observed_s=2.5,
            limit_s=2.0,
            message="m \u00fc",
            last_activity_s=3.0,
            last_activity_wall=1764590000.5,
            last_heartbeat_s=4.0,
            open_sections=("step", "fwd"),
            stack=StackSummary(collective="all_reduce", location="train.py:53", function="main"),
            proc_state="S",
            collective=CollectiveState(op="all_reduce", group="default_pg", seq=5, pending=True),
        ),
        b'{"event":"rank_terminated","local_rank":1,"rank":9,"pid":1234,"v":1,'
        b'"cause":"section_timeout","section":"step","observed_s":2.5,"limit_s":2.0,'
        b'"message":"m \xc3\xbc","last_activity_s":3.0,"last_activity_wall":1764590000.5,'
        b'"last_heartbeat_s":4.0,"open_sections":["step","fwd"],'
        b'"stack":{"collective":"all_reduce","location":"train.py:53","function":"main"},'
        b'"proc_state":"S",'
        b'"collective":{"op":"all_reduce","group":"default_pg","seq":5,"pending":true}}',
    ),
    (
        RankTerminated(local_rank=0, rank=0, pid=1, cause="heartbeat_timeout", message="m"),
        b'{"event":"rank_terminated","local_rank":0,"rank":0,"pid":1,"v":1,'
        b'"cause":"heartbeat_timeout","message":"m"}',
    ),
    (
        RankFirstStep(
            local_rank=2,
            rank=3,
            pid=55,
            step_wall=1764590000.25,
            since_init_s=12.5,
            via="heartbeat",
        ),
        b'{"event":"rank_first_step","local_rank":2,"rank":3,"pid":55,"v":1,'
        b'"step_wall":1764590000.25,"since_init_s":12.5,"via":"heartbeat"}',
    ),
    (
        WorkloadRequest(local_rank=0, rank=4, pid=66, action="ExcludeThisNode", description="x"),
        b'{"event":"workload_control","local_rank":0,"rank":4,"pid":66,"v":1,'
        b'"action":"ExcludeThisNode","description":"x"}',
    ),
]


@pytest.mark.parametrize(("event", "wire"), WIRE, ids=lambda v: getattr(v, "EVENT", None))
def test_each_kind_encodes_to_the_same_bytes_and_parses_back_to_its_type(
    event: RankEvent, wire: bytes
) -> None:
    assert encode_event(event) == wire
    back = parse_event(wire)
    assert type(back) is type(event)
    assert back == event
    # The public flat view reads and writes the very same bytes.
    flat = parse_monitor_event(wire)
    assert flat == MonitorEvent.of(event)
    assert flat.event == event.EVENT
    assert flat.to_bytes() == wire
    assert flat.typed() == event


def test_every_kind_has_one_type_and_its_fields_are_the_flat_views() -> None:
    kinds = {type(e) for e, _ in WIRE}
    assert {k.EVENT for k in kinds} == EVENT_KINDS
    flat = {f.name for f in dataclasses.fields(MonitorEvent)}
    for kind in kinds:
        assert {f.name for f in dataclasses.fields(kind)} <= flat, kind


def test_a_flat_event_of_an_unknown_kind_or_an_oversized_one_is_not_encoded() -> None:
    with pytest.raises(ValueError, match="unknown event 'hello'"):
        MonitorEvent("hello", 0, 0, 1).to_bytes()
    big = WorkloadRequest(
        local_rank=0, rank=0, pid=1, action="Continue", description="x" * MAX_EVENT_BYTES
    )
    with pytest.raises(ValueError, match=r"workload_control event of \d+ bytes exceeds"):
        encode_event(big)
