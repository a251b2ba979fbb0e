"""initialize/shutdown in any order; wrap/restore for every kind of callable."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from nvrx.straggler import (
    CallableId,
    Detector,
    StragglerDetector,
    SyntheticKernelTimer,
)


def test_initialize_and_shutdown_are_idempotent_in_any_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Detector.shutdown()
    assert Detector.instance() is None
    first = Detector.initialize(kernel_timer=SyntheticKernelTimer(), node_name="n")
    assert getattr(Detector, "initialized") is True  # noqa: B009 - defeat narrowing
    assert Detector.instance() is first
    again = Detector.initialize(node_name="n")
    assert again is first
    with caplog.at_level(logging.WARNING):
        other = Detector.initialize(profiling_interval=5, node_name="n")
    assert other is first
    assert "already initialized" in caplog.text
    assert Detector.profiling_interval == 1
    Detector.shutdown()
    Detector.shutdown()
    assert not Detector.initialized
    assert Detector.cupti_manager is None
    assert not Detector.is_interval_elapsed()
    assert first.closed
    second = Detector.initialize(kernel_timer=SyntheticKernelTimer(), profiling_interval=2)
    assert second is not first
    assert Detector.profiling_interval == 2
    Detector.shutdown()


def _f(x: int) -> int:
    return x + 1


module = types.ModuleType("fake_module")
module.f = _f  # type: ignore[attr-defined]


class Base:
    def method(self, x: int) -> int:
        return x * 2

    @staticmethod
    def static(x: int) -> int:
        return x * 3

    @classmethod
    def klass(cls, x: int) -> str:
        return f"{cls.__name__}:{x}"

    def inherited(self) -> str:
        return "base"


class Child(Base):
    pass


def test_wrap_and_restore_every_kind_of_callable() -> None:
    Detector.initialize(kernel_timer=SyntheticKernelTimer())
    raw = {name: Base.__dict__[name] for name in ("method", "static", "klass")}
    obj = Base()
    Detector.wrap_callables(
        [
            CallableId(Base, "method"),
            CallableId(Base, "static"),
            CallableId(Base, "klass"),
            CallableId(Child, "inherited"),
        ]
    )
    Detector.wrap_callables([CallableId(obj, "method"), CallableId(module, "f")])
    # calls through the class and through instances keep their meaning
    assert Base().method(2) == 4
    assert obj.method(2) == 4
    assert Base.static(2) == 6
    assert obj.static(2) == 6
    assert Base.klass(1) == "Base:1"
    assert obj.klass(1) == "Base:1"
    assert Child.klass(1) == "Child:1"
    assert Child().inherited() == "base"
    assert module.f(1) == 2
    assert isinstance(Base.__dict__["static"], staticmethod)
    assert isinstance(Base.__dict__["klass"], classmethod)
    names = set(Detector.custom_sections)
    prefix = f"{Base.__module__}.Base"
    assert {
        f"{prefix}.method",
        f"{prefix}.static",
        f"{prefix}.klass",
        f"{Child.__module__}.Child.inherited",
        "Base.method",
        "fake_module.f",
    } <= names
    assert Detector.custom_sections["Base.method"].total_entry_cnt == 1
    assert Detector.custom_sections[f"{prefix}.method"].total_entry_cnt == 2
    assert Detector.custom_sections[f"{prefix}.static"].total_entry_cnt == 2
    assert len(Detector.original_callables) == 6
    # wrapping again is a no-op, not a double wrap
    Detector.wrap_callables([CallableId(Base, "method")])
    assert Base().method(1) == 2
    assert Detector.custom_sections[f"{prefix}.method"].total_entry_cnt == 3

    Detector.restore_original_callables()
    for name, value in raw.items():
        assert Base.__dict__[name] is value
    assert "inherited" not in Child.__dict__
    assert "method" not in vars(obj)
    assert module.f is _f
    assert Detector.original_callables == {}
    # a second wrap after restore works, and shutdown restores too
    Detector.wrap_callables([CallableId(Base, "static")])
    assert Base.__dict__["static"] is not raw["static"]
    Detector.shutdown()
    assert Base.__dict__["static"] is raw["static"]


def test_callable_id_filters_and_extra_args() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())

    class Model:
        def forward(self, x: int, mode: str = "train") -> int:
            return x

    def only_train(bound: Any) -> bool:
        return bool(bound.arguments.get("mode", "train") == "train")

    def by_x(bound: Any) -> dict[str, Any]:
        assert "self" not in bound.arguments
        return {"x": bound.arguments["x"]}

    det.wrap_callables(
        [
            CallableId(
                Model,
                "forward",
                arg_filter_fn=only_train,
                extra_args_fn=by_x,
                ignored_args=("self",),
            )
        ]
    )
    m = Model()
    assert m.forward(1) == 1
    assert m.forward(2, mode="eval") == 2
    base = f"{Model.__module__}.Model.forward"
    assert set(det.custom_sections) == {f"{base}(x=1)"}
    det.close()
    assert "forward" in Model.__dict__
    assert not hasattr(Model.__dict__["forward"], "__wrapped__")


def test_wrap_errors_name_the_callable() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        det.wrap_callables([CallableId(Base, "missing")])

    class Holder:
        value = property(lambda self: 1)

    with pytest.raises(TypeError, match="cannot be wrapped"):
        det.wrap_callables([CallableId(Holder, "value")])
    det.close()
