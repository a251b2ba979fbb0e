"""Types of the optional C extension built from ``_hotpath.c`` (see sections.py)."""

from collections.abc import Callable, Collection
from types import CodeType, FrameType, TracebackType
from typing import final

from nvrx.straggler._kernels import KernelTimer
from nvrx.straggler.sections import CustomSection, SectionContext

@final
class Counter:
    value: int
    def __init__(self, value: int = 0) -> None: ...

@final
class Handle:
    code: CodeType | None
    def __init__(
        self,
        section: CustomSection,
        interval: int,
        code: CodeType,
        lasti: int,
        timer: KernelTimer | None = None,
    ) -> None: ...
    @property
    def section(self) -> CustomSection: ...
    @property
    def lasti(self) -> int: ...
    @property
    def accepted(self) -> set[tuple[str, CodeType, int]]: ...
    @property
    def timer(self) -> KernelTimer | None: ...
    @property
    def measuring(self) -> bool: ...
    @property
    def _nested(self) -> int: ...
    def __enter__(self) -> None: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

@final
class Dispatcher:
    def __init__(
        self,
        cpu_handles: dict[str | None, SectionContext],
        kernel_handles: dict[str | None, SectionContext],
        anonymous: dict[tuple[str, CodeType, int, bool], SectionContext],
        miss: Callable[[str | None, bool, FrameType], SectionContext],
        moved: Callable[[SectionContext, FrameType], None],
    ) -> None: ...
    def __call__(self, name: str | None = None, profile_cuda: bool = True) -> SectionContext: ...

def summarize(
    samples: Collection[float], count: int | None
) -> tuple[float, float, float, float, float, float]: ...
