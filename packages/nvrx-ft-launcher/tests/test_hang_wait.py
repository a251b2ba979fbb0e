"""The hang is attributed as soon as its evidence is in, while the ranks still run.

Real rank processes (torch's ``start_processes``, sleeping as hung ranks that survive
SIGTERM do), a real worker group and a real recorder writing a journal.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed
from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from nvrx.ft._events import RankTerminated
from nvrx.launcher import _hang_wait
from nvrx.launcher._cycle_state import CycleState
from nvrx.launcher._events import Recorder
from nvrx.launcher._failure_report import attribute_hang
from nvrx.launcher.journal import JsonLines

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]
dist: Any = torch.distributed  # its stubs do not re-export the store classes
WORLD = 2


@pytest.fixture
def ranks(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Two real rank processes that neither report nor exit while the test runs."""
    pc = start_processes(
        name="hang-wait",
        entrypoint="sleep",
        args={i: ("60",) for i in range(WORLD)},
        envs={i: {} for i in range(WORLD)},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
    )
    try:
        yield pc
    finally:
        pc.close()


@pytest.fixture
def group() -> WorkerGroup:
    """This node's worker group: both ranks of a single-node world."""
    tcp = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=5),
    )  # fmt: skip
    handler = dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        "hang-wait", tcp, C10dRendezvousBackend(tcp, "hang-wait"), min_nodes=1, max_nodes=1
    )
    spec = WorkerSpec(
        role="hang-wait", local_world_size=WORLD, rdzv_handler=handler, entrypoint="sleep"
    )
    wg = WorkerGroup(spec)
    for worker in wg.workers:
        worker.global_rank, worker.world_size = worker.local_rank, WORLD
    return wg


def _report(cycle: CycleState, local_rank: int, *, cause: str = "heartbeat_timeout") -> None:
    """A monitor's report, as :class:`._rank_reports.RankReports` keeps it."""
    cycle.terminated[local_rank] = RankTerminated(
        local_rank=local_rank,
        rank=local_rank,
        pid=1000 + local_rank,
        cause=cause,
        message="no heartbeat",
        last_activity_wall=1000.0 + 5 * local_rank,  # rank 0 went stale first
    )
    if cycle.first_report_mono is None:
        cycle.first_report, cycle.first_report_mono = time.time(), time.monotonic()


def _attributed(journal: pathlib.Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    return [r for r in records if r["event"] == "hang_attributed"]


def test_attributed_once_every_rank_reported_while_they_still_run(
    ranks: Any, group: WorkerGroup, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    recorder = Recorder(JsonLines(journal, node="n"), JsonLines(None))
    cycle = CycleState(number=0, started=time.time(), progress=None)
    handlers = ranks.subprocess_handlers
    assert not _hang_wait.attribute_when_in(cycle, handlers, group, recorder), "no report yet"
    assert _hang_wait.tick_wait_s(cycle, 5.0) == 5.0

    _report(cycle, 0)
    assert not _hang_wait.attribute_when_in(cycle, handlers, group, recorder), "rank 1 to come"
    # The loop wakes for the evidence wait's end, not an interval later.
    assert _hang_wait.tick_wait_s(cycle, 5.0) <= _hang_wait.HANG_EVIDENCE_WAIT_S

    _report(cycle, 1)
    assert _hang_wait.attribute_when_in(cycle, handlers, group, recorder)
    assert all(h.proc.poll() is None for h in handlers.values()), "no rank had to exit"
    [record] = _attributed(journal)
    assert record["culprit"] == 0, record
    assert record["victims"] == [1], record
    assert _hang_wait.tick_wait_s(cycle, 5.0) == 5.0

    # Once a cycle: the failure's report later reuses the finding, journals nothing new.
    assert not _hang_wait.attribute_when_in(cycle, handlers, group, recorder)
    again = attribute_hang(cycle, group, recorder)
    assert again is not None
    assert again.culprit == 0
    assert len(_attributed(journal)) == 1
    waited = _hang_wait.await_hang_evidence(
        cycle, handlers, wait=lambda s: None, drain=lambda: None
    )
    assert waited is True


def test_attributed_when_the_evidence_wait_ends_without_the_silent_rank(
    ranks: Any, group: WorkerGroup, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    recorder = Recorder(JsonLines(journal, node="n"), JsonLines(None))
    cycle = CycleState(number=0, started=time.time(), progress=None)
    _report(cycle, 1)
    assert cycle.first_report_mono is not None
    cycle.first_report_mono -= _hang_wait.HANG_EVIDENCE_WAIT_S  # the wait has ended
    assert _hang_wait.tick_wait_s(cycle, 5.0) == 0.0
    assert _hang_wait.attribute_when_in(cycle, ranks.subprocess_handlers, group, recorder)
    [record] = _attributed(journal)
    assert record["culprit"] is None, record  # one rank's evidence decides nothing


@pytest.mark.parametrize("cause", ["gpu_health", "nic_health"])
def test_a_health_termination_is_no_hang_to_attribute(
    ranks: Any, group: WorkerGroup, tmp_path: pathlib.Path, cause: str
) -> None:
    journal = tmp_path / "journal.jsonl"
    recorder = Recorder(JsonLines(journal, node="n"), JsonLines(None))
    cycle = CycleState(number=0, started=time.time(), progress=None)
    _report(cycle, 0, cause=cause)
    _report(cycle, 1, cause=cause)
    assert not _hang_wait.attribute_when_in(cycle, ranks.subprocess_handlers, group, recorder)
    assert _hang_wait.tick_wait_s(cycle, 5.0) == 5.0
    assert not cycle.hang_attributed
    assert not journal.exists() or not _attributed(journal)
