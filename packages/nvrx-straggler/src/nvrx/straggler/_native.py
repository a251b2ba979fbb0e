"""The optional C extension ``_hotpath``, loaded once for the whole package.

It accelerates the per-entry path (:mod:`nvrx.straggler.sections`) and window
statistics (:mod:`nvrx.straggler.statistics`); the Python code there is the
definition and runs wherever the extension is not built or
``NVRX_STRAGGLER_PURE_PYTHON=1`` switches it off. Importing this does not import torch.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

__all__ = ["HOT_PATH", "hotpath"]

log = logging.getLogger("nvrx.straggler")


def _load() -> ModuleType | None:
    if os.environ.get("NVRX_STRAGGLER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from nvrx.straggler import _hotpath
    except ImportError as e:
        # Said once, at import, as a warning: an sdist installed without a compiler runs
        # this way and the user can do something about it (NVRX_STRAGGLER_PURE_PYTHON=1
        # chooses it and is not warned about).
        log.warning(
            "straggler detection runs its pure-Python path, several times slower: the C "
            "hot path (nvrx.straggler._hotpath) is not built (%s). Install the wheel from "
            "`nox -s build`, or reinstall nvrx-straggler where a C compiler and the Python "
            "headers are present; NVRX_STRAGGLER_PURE_PYTHON=1 chooses this path quietly",
            e,
        )
        return None
    return _hotpath


#: The C extension, or None where it is not built or is switched off.
hotpath: ModuleType | None = _load()
#: Which implementation runs in this process: ``"c"`` or ``"python"``.
HOT_PATH: str = "python" if hotpath is None else "c"
