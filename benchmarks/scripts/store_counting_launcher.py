"""Run ``ft_launcher`` with every ``torch.distributed.Store`` call counted (benchmark only).

    python store_counting_launcher.py COUNTS.json LAUNCHER-ARGS...

Wraps the Python-level methods of torch's ``Store`` class (which ``TCPStore`` and
``PrefixStore`` inherit) in this process, so each call the launcher, torch's c10d
rendezvous backend and the agent make is noted with its wall-clock time, method,
number of keys and caller (file:function). At exit the calls are written to COUNTS.json
as ``{"calls": [[t, method, keys, caller], ...]}``; the benchmark sums them over the
window of each restart. Calls C++ makes on its own (a ``PrefixStore`` forwarding to its
``TCPStore``, the store server) are not Python calls and are not counted twice.
"""

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from torch._C._distributed_c10d import Store

#: Store methods that move keys (the rest, e.g. set_timeout, clone, are local).
METHODS = (
    "set", "compare_set", "add", "append", "multi_set", "delete_key", "queue_push",
    "get", "check", "wait", "num_keys", "multi_get", "list_keys", "queue_pop",
    "queue_len", "barrier",
)  # fmt: skip

CALLS: list[tuple[float, str, int, str]] = []


def _keys(method: str, args: tuple[Any, ...]) -> int:
    if method in ("multi_get", "check", "wait") and args and isinstance(args[0], list):
        return len(args[0])
    if method == "multi_set" and args and isinstance(args[0], list):
        return len(args[0])
    return 0 if method in ("num_keys", "list_keys", "barrier") else 1


def _counted(method: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Store, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code
        where = f"{os.path.basename(caller.co_filename)}:{caller.co_name}"
        CALLS.append((time.time(), method, _keys(method, args), where))
        return original(self, *args, **kwargs)

    return call


def _install() -> None:
    for method in METHODS:
        original = Store.__dict__.get(method)
        if original is not None:
            setattr(Store, method, _counted(method, original))


def _write(path: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump({"calls": CALLS}, handle)
    os.replace(tmp, path)


def main() -> None:
    counts, argv = sys.argv[1], sys.argv[2:]
    _install()
    from nvrx.launcher.cli import main as launcher_main

    code = 1
    try:
        code = launcher_main(argv)
    finally:
        _write(counts)
        sys.stdout.flush()
        sys.stderr.flush()
        # As ft_launcher's own entry point: skip tearing down the imported torch.
        os._exit(code)


if __name__ == "__main__":
    main()
