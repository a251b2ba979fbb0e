"""Entry point of a monitor process: ``python -m nvrx.ft._monitor_main``.

Started by :meth:`nvrx.ft.RankMonitorServer.run_in_subprocess`; not meant to be run by
hand. It never imports torch, so a monitor starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys

from nvrx.ft.config import FaultToleranceConfig
from nvrx.ft.server import RankMonitorServer

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel to SIGTERM us when our parent dies (we then remove our socket and exit).

    The server also polls ``os.getppid()``, which covers the case where the parent
    thread that started us exits while the launcher lives on (PDEATHSIG fires then too,
    so the launcher must start monitors from a thread that lives as long as it does).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the server's parent polling still applies
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(f"rank monitor: parent {parent_pid} is already gone")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments the launcher passes and serve until stopped."""
    parser = argparse.ArgumentParser(prog="python -m nvrx.ft._monitor_main")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--local-rank", type=int, default=0)
    parser.add_argument("--events-socket", default=None)
    parser.add_argument("--ready-fd", type=int, default=None)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    cfg = FaultToleranceConfig._from_peer(json.loads(args.config_json))
    server = RankMonitorServer(
        cfg, args.socket, local_rank=args.local_rank, events_socket=args.events_socket
    )
    return server.serve(ready_fd=args.ready_fd)


if __name__ == "__main__":
    sys.exit(main())
