"""Turn torch's flight recorder on for the ranks when the user has not chosen a size.

Hang attribution (:mod:`nvrx.launcher._culprit`) reads each hung rank's flight recorder
to name the collective its peers wait in. torch 2.13 records gloo and NCCL collectives
in a ring of ``TORCH_FR_BUFFER_SIZE`` entries (``TORCH_NCCL_TRACE_BUFFER_SIZE``, its
older name, still counts); a user who set either keeps their value, 0 included.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = ["FR_BUFFER_ENV", "FR_DEFAULT_ENTRIES", "enable_flight_recorder"]

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
_FR_LEGACY_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
#: Entries kept when the user chose none: torch's NCCL default, about 1 MiB as JSON.
FR_DEFAULT_ENTRIES = 2000


def enable_flight_recorder(env: MutableMapping[str, str]) -> bool:
    """Set ``TORCH_FR_BUFFER_SIZE`` in ``env`` unless a size is set; True when it set it."""
    if env.get(FR_BUFFER_ENV) or env.get(_FR_LEGACY_ENV):
        return False
    env[FR_BUFFER_ENV] = str(FR_DEFAULT_ENTRIES)
    return True
