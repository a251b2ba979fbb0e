"""Where a node stands in the scheduler's order: SLURM_PROCID, then GROUP_RANK, then torch's.

Pure, standard library only. :mod:`._group_rank` sorts the nodes of a round by it,
:mod:`._segments` and :mod:`._segment_gate` order the nodes of a segment by it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

__all__: list[str] = []

#: The largest scheduler index (or previous group rank) a node may publish.
MAX_INDEX = 10**7


@dataclasses.dataclass(frozen=True, order=True)
class InfraKey:
    """What orders a node: scheduler index first, then GROUP_RANK, then torch's rank.

    ``tier`` is 0 for SLURM_PROCID, 1 for GROUP_RANK, 2 for neither (then ``index`` is
    torch's rank, its stable order).
    """

    tier: int
    index: int

    def to_json(self) -> str:
        return json.dumps({"tier": self.tier, "index": self.index})

    @classmethod
    def from_json(cls, text: bytes | str) -> InfraKey:
        """Parse a published key; ValueError for anything but two small ints."""
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError(f"not an infra rank key: {text!r}") from None
        if not isinstance(data, dict) or set(data) != {"tier", "index"}:
            raise ValueError(f"not an infra rank key: {text!r}")
        tier, index = data["tier"], data["index"]
        if not all(type(v) is int for v in (tier, index)):
            raise ValueError(f"not an infra rank key: {text!r}")
        if not (0 <= tier <= 2 and 0 <= index <= MAX_INDEX):
            raise ValueError(f"infra rank key out of range: {text!r}")
        return cls(tier, index)


def _index(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    # ASCII digits only: str.isdigit() also passes "²", which int() refuses.
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_INDEX:
        return None
    return int(text)


def infra_key(env: Mapping[str, str], torch_rank: int) -> InfraKey:
    """This node's key: SLURM_PROCID if set, else GROUP_RANK, else torch's rank."""
    for tier, name in enumerate(("SLURM_PROCID", "GROUP_RANK")):
        index = _index(env, name)
        if index is not None:
            return InfraKey(tier, index)
    return InfraKey(2, torch_rank)
