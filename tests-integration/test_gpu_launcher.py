"""ft_launcher with 2 ranks on the GPU (``nox -s gpu_tests``; skipped without a GPU).

Two ranks of ``scripts/cuda_steps.py`` share the machine's GPUs (NCCL where each has a
GPU of its own, else gloo's CUDA all-reduce): rank 1 is SIGKILLed in the first attempt
and SIGSTOPped in the second; each time ft_launcher restarts both ranks, which resume
from the checkpoint on the GPU and finish with every step run once. Cold, and with
``--warm-spares``, whose restarted ranks come from spares. Nothing is left behind (the
``launch`` fixture fails the test otherwise).
"""

from __future__ import annotations

import pathlib

import pytest
from conftest import Launch
from itest_harness import HERE, assert_every_step_once, journal_events

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multiprocess,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA_STEPS = HERE / "scripts" / "cuda_steps.py"
STEPS = 12
FAULTS = ["--fault=sigkill:1:5:0", "--fault=sigstop:1:5:1"]


@pytest.mark.parametrize("spares", [[], ["--warm-spares"]], ids=["cold", "warm-spares"])
def test_killed_and_stopped_gpu_ranks_are_restarted(
    launch: Launch, tmp_path: pathlib.Path, spares: list[str]
) -> None:
    journal_path = tmp_path / "launcher-journal.jsonl"
    run = launch(
        [f"--steps={STEPS}", "--checkpoint-every=2", *FAULTS],
        [*spares, f"--ft-journal={journal_path}"],
        script=CUDA_STEPS,
    )
    run.expect_exit(0, 240)
    journal = run.journal()
    starts = [e for e in journal if e["event"] == "start"]
    assert {e["attempt"] for e in starts} == {0, 1, 2}
    assert all(e["device"].startswith("cuda") for e in starts)
    backends = {e["backend"] for e in starts}
    assert len(backends) == 1
    assert backends <= {"nccl", "gloo"}
    assert all(e["on"].startswith("cuda") for e in journal if e["event"] == "step")
    assert_every_step_once(journal, STEPS, ranks=(0, 1))
    faults = [(e["attempt"], e["kind"]) for e in journal if e["event"] == "fault"]
    assert faults == [(0, "sigkill"), (1, "sigstop")]
    assert len(run.restarts()) == 2
    started = journal_events(journal_path, "workers_started")
    assert [e["cycle"] for e in started] == [0, 1, 2]
    if spares:  # the first restart took its ranks from warm spares
        assert started[1]["warm_local_ranks"], started
