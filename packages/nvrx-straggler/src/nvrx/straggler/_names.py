"""Dense integer ids for section and kernel names, identical on every rank.

Reports exchange fixed-size vectors indexed by these ids, so a name crosses the
wire once: when some rank first reports it. Each rank then sends only the names
it does not know yet; all ranks assign ids to the gathered names in rank order,
sections before kernels, so the ids agree everywhere and never change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["NameMapper"]


class NameMapper:
    """Maps section and kernel names to ids shared by all ranks."""

    def __init__(self) -> None:
        self.section_name_to_id: dict[str, int] = {}
        self.kernel_name_to_id: dict[str, int] = {}
        self.id_to_section_name: list[str] = []
        self.id_to_kernel_name: list[str] = []

    @property
    def section_counter(self) -> int:
        """Number of section ids assigned."""
        return len(self.id_to_section_name)

    @property
    def kernel_counter(self) -> int:
        """Number of kernel ids assigned."""
        return len(self.id_to_kernel_name)

    def get_section_id(self, name: str) -> int:
        """The id of a known section name (KeyError if unknown)."""
        return self.section_name_to_id[name]

    def get_kernel_id(self, name: str) -> int:
        """The id of a known kernel key (KeyError if unknown)."""
        return self.kernel_name_to_id[name]

    def get_section_name(self, section_id: int) -> str:
        """The section name of an id."""
        return self.id_to_section_name[section_id]

    def get_kernel_name(self, kernel_id: int) -> str:
        """The kernel key of an id."""
        return self.id_to_kernel_name[kernel_id]

    def unknown(
        self, section_names: Iterable[str], kernel_names: Iterable[str]
    ) -> tuple[list[str], list[str]]:
        """The names this rank would have to announce (not yet mapped)."""
        sections = [n for n in section_names if n not in self.section_name_to_id]
        kernels = [n for n in kernel_names if n not in self.kernel_name_to_id]
        return sections, kernels

    def assign(self, announced: Sequence[tuple[Sequence[str], Sequence[str]]]) -> None:
        """Give ids to announced (sections, kernels) lists, taken in rank order."""
        for sections, _ in announced:
            for name in sections:
                if name not in self.section_name_to_id:
                    self.section_name_to_id[name] = len(self.id_to_section_name)
                    self.id_to_section_name.append(name)
        for _, kernels in announced:
            for name in kernels:
                if name not in self.kernel_name_to_id:
                    self.kernel_name_to_id[name] = len(self.id_to_kernel_name)
                    self.id_to_kernel_name.append(name)
