"""One rank of a local-checkpoint test job (gloo on 127.0.0.1), driven by a JSON spec.

argv[1] is the spec: node_dir, job, replicas, max_share, global_iteration, saves (list of
iterations), size (floats per tensor), kill_in_finish (iteration at which the rank
SIGKILLs itself inside the background write, after the bytes were copied and before
the preamble), every_s (use maybe_save with that interval), out (result JSON path).
The rank's "node" is GROUP_RANK from the environment. Result: what restore returned
(source, iteration, a digest of the state) and the iterations saved.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings, _engine


def state_for(rank: int, iteration: int, size: int) -> dict[str, Any]:
    return {
        "w": torch.full((size,), float(rank * 1000 + iteration)),
        "nested": {"ids": torch.arange(rank + 3), "tag": f"r{rank}"},
        "rank": rank,
        "iteration": iteration,
    }


def digest(state: dict[str, Any] | None) -> list[Any] | None:
    if state is None:
        return None
    return [
        float(state["w"][0]),
        float(state["w"][-1]),
        int(state["w"].numel()),
        state["nested"]["ids"].tolist(),
        state["nested"]["tag"],
        state["rank"],
        state["iteration"],
    ]


def main() -> int:
    spec = json.loads(sys.argv[1])
    _engine.COMM_TIMEOUT_S = float(spec.get("comm_timeout", 30.0))
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    settings = LocalCkptSettings(
        node_dir=pathlib.Path(spec["node_dir"]),
        job_id=spec.get("job", "job-t"),
        replicas=int(spec.get("replicas", 1)),
        max_share=float(spec.get("max_share", 0.5)),
        every_s=spec.get("every_s"),
    )
    lc = LocalCheckpoints(settings)
    kill_at = spec.get("kill_in_finish")
    if kill_at is not None:
        engine = lc._engine
        assert engine is not None
        original = engine._finish

        def finish(slot_idx: int, iteration: int, *args: Any) -> None:
            if iteration == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            original(slot_idx, iteration, *args)

        engine._finish = finish  # type: ignore[method-assign,assignment]
    template = state_for(rank, 0, int(spec.get("size", 1000)))
    res = lc.restore(template, global_iteration=spec.get("global_iteration"))
    out: dict[str, Any] = {
        "rank": rank,
        "source": res.source.value,
        "iteration": res.iteration,
        "digest": digest(res.state),
        "saved": [],
    }
    size = int(spec.get("size", 1000))
    for it in spec.get("saves", []):
        if spec.get("every_s") is not None:
            ok = lc.maybe_save(it, state_for(rank, it, size))
            time.sleep(float(spec.get("step_s", 0.0)))
        else:
            ok = lc.save(it, state_for(rank, it, size))
        lc.wait(60)
        if ok:
            out["saved"].append(it)
    if spec.get("barrier", True):
        dist.barrier()
    lc.close()
    pathlib.Path(spec["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
