"""Background threads yield the CPU to training.

A snapshot's checksums and transfers run on threads of the training process. Where
every core is busy with training (intra-op threads of a CPU job, or a host loaded by
data loaders), a background thread at the training's priority takes slices from an
intra-op worker and the others wait for it at the next barrier: measured on 2 cores,
a save every step of a 100 MB state slowed the loop by 5-11 % at the same priority and
4-6 % at +10, with every save still finished in time. With idle cores (a GPU node's
host) the priority changes nothing.
"""

from __future__ import annotations

import os
import threading

__all__: list[str] = []

NICE_INCREMENT = 10
"""How much lower than the training a background thread runs (Linux niceness)."""


def lower_this_thread() -> None:
    """Make the calling thread NICE_INCREMENT nicer (up to 19); nothing if not possible.

    On Linux, niceness belongs to the thread: ``setpriority`` on a thread id leaves the
    process's other threads alone."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + NICE_INCREMENT))
    except OSError:
        return
