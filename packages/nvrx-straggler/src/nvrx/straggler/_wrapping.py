"""Wrap existing callables in a detection section, and put them back exactly.

The wrapper keeps the kind of attribute it replaces: a function on a class stays a
function (it binds as a method), a ``staticmethod`` stays a static method, a
``classmethod`` stays a class method, so calls through the class or through an
instance behave as before. On an instance or module the attribute is set on that
object only. Restoring puts back the object that was there, or removes the
attribute if it was inherited.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Any

__all__ = ["CallableId", "CallableWrapper", "WrappedCallable"]

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class CallableId:
    """Names a callable to time: the attribute ``name`` of ``obj``.

    ``arg_filter_fn`` returns False for calls that should not be timed,
    ``extra_args_fn`` returns values appended to the section name (one section per
    distinct value set), and ``ignored_args`` are argument names removed before those
    two functions see the bound arguments.
    """

    obj: object
    name: str
    arg_filter_fn: Callable[[inspect.BoundArguments], bool] | None = None
    extra_args_fn: Callable[[inspect.BoundArguments], dict[str, Any]] | None = None
    ignored_args: tuple[str, ...] | None = None

    def __str__(self) -> str:
        obj = self.obj
        if isinstance(obj, types.ModuleType):
            obj_name = obj.__name__
        elif isinstance(obj, type):
            obj_name = f"{obj.__module__}.{obj.__name__}"
        elif hasattr(obj, "__class__"):
            obj_name = type(obj).__name__
        else:  # pragma: no cover - every Python object has __class__
            obj_name = str(getattr(obj, "__name__", obj))
        return f"{obj_name}.{self.name}"


SectionFactory = Callable[[str, bool], AbstractContextManager[None]]


@dataclasses.dataclass(frozen=True)
class WrappedCallable:
    """One wrapped attribute and what to restore."""

    callable_id: CallableId
    original: object
    """What ``obj.__dict__[name]`` held, or the sentinel for "not set on obj"."""
    found: object
    """What ``getattr(obj, name)`` returned before wrapping."""


def _timed(
    fn: Callable[..., Any],
    cid: CallableId,
    section: SectionFactory,
    profile_cuda: bool,
) -> Callable[..., Any]:
    name = str(cid)
    if cid.arg_filter_fn is None and cid.extra_args_fn is None:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with section(name, profile_cuda):
                return fn(*args, **kwargs)

        return wrapper

    signature = inspect.signature(fn)
    ignored = set(cid.ignored_args or ())

    @functools.wraps(fn)
    def filtered(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for arg in ignored:
            bound.arguments.pop(arg, None)
        if cid.arg_filter_fn is not None and not cid.arg_filter_fn(bound):
            return fn(*args, **kwargs)
        section_name = name
        if cid.extra_args_fn is not None:
            extra = cid.extra_args_fn(bound)
            if extra:
                section_name += "(" + ",".join(f"{k}={extra[k]}" for k in sorted(extra)) + ")"
        with section(section_name, profile_cuda):
            return fn(*args, **kwargs)

    return filtered


class CallableWrapper:
    """Keeps track of wrapped attributes so they can be restored in reverse order."""

    def __init__(self, section: SectionFactory) -> None:
        self._section = section
        self.wrapped: list[WrappedCallable] = []

    @property
    def original_callables(self) -> dict[CallableId, object]:
        """CallableId -> the attribute value found when it was wrapped."""
        return {w.callable_id: w.found for w in self.wrapped}

    def _is_wrapped(self, cid: CallableId) -> bool:
        return any(
            w.callable_id.obj is cid.obj and w.callable_id.name == cid.name for w in self.wrapped
        )

    def wrap(self, callable_ids: list[CallableId], profile_cuda: bool = True) -> None:
        """Wrap each callable; already wrapped ones are left as they are."""
        for cid in callable_ids:
            if not isinstance(cid, CallableId):
                raise TypeError(f"wrap_callables: expected CallableId items, got {cid!r}")
            if self._is_wrapped(cid):
                continue
            self._wrap_one(cid, profile_cuda)

    def _wrap_one(self, cid: CallableId, profile_cuda: bool) -> None:
        obj, name = cid.obj, cid.name
        try:
            current = getattr(obj, name)
        except AttributeError:
            raise AttributeError(f"wrap_callables: {obj!r} has no attribute {name!r}") from None
        own = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        if isinstance(obj, type):
            raw = inspect.getattr_static(obj, name)
            new: object
            if isinstance(raw, staticmethod):
                new = staticmethod(_timed(raw.__func__, cid, self._section, profile_cuda))
            elif isinstance(raw, classmethod):
                new = classmethod(_timed(raw.__func__, cid, self._section, profile_cuda))
            elif isinstance(raw, types.FunctionType):
                new = _timed(raw, cid, self._section, profile_cuda)
            elif callable(raw) and not hasattr(type(raw), "__get__"):
                new = staticmethod(_timed(raw, cid, self._section, profile_cuda))
            else:
                raise TypeError(
                    f"wrap_callables: {cid} is a {type(raw).__name__}, which cannot be wrapped"
                )
        else:
            if not callable(current):
                raise TypeError(f"wrap_callables: {cid} is not callable: {current!r}")
            new = _timed(current, cid, self._section, profile_cuda)
        try:
            setattr(obj, name, new)
        except (AttributeError, TypeError) as e:
            raise TypeError(f"wrap_callables: cannot set {name!r} on {obj!r}: {e}") from e
        self.wrapped.append(WrappedCallable(cid, own, current))

    def restore(self) -> None:
        """Put every wrapped attribute back, newest first, and forget them."""
        while self.wrapped:
            w = self.wrapped.pop()
            obj, name = w.callable_id.obj, w.callable_id.name
            if w.original is _MISSING:
                with suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, w.original)
