"""One rank for bench_local_ckpt's restore-from-peer figure (gloo on 127.0.0.1).

argv: node_dir, n_floats, mode ("save" or "restore"), out. Save: one snapshot of
iteration 1, replicated to the other node, then close. Restore: restore and write the
source and seconds to ``out``.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

import torch
import torch.distributed as dist

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings


def main() -> int:
    node_dir, n, mode, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    lc = LocalCheckpoints(LocalCkptSettings(node_dir=pathlib.Path(node_dir), job_id="bench"))
    if mode == "save":
        lc.save(1, {"w": torch.ones(n)})
        lc.wait(120)
        dist.barrier()
        result: dict[str, object] = {}
    else:
        res = lc.restore({"w": torch.empty(0)})
        result = {"source": res.source.value, "seconds": res.seconds}
    lc.close()
    pathlib.Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
