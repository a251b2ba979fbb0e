"""TimeoutsCalc: maxima, calculation, merging, and the reference's fragile spots fixed."""

from __future__ import annotations

import pytest

from nvrx.ft import (
    HeartbeatTimeouts,
    SectionAction,
    SectionTimeouts,
    TimeoutsCalc,
    TimeoutsCalcError,
)

OPEN, CLOSE, CLOSE_ALL = SectionAction.OPEN, SectionAction.CLOSE, SectionAction.CLOSE_ALL


def test_heartbeat_maxima_and_timeouts() -> None:
    calc = TimeoutsCalc(start_time=100.0, safety_factor=2.0)
    assert not calc.can_get_hb_timeouts()
    calc.update_on_heartbeat(103.0)  # initial interval 3
    assert not calc.can_get_hb_timeouts()
    calc.update_on_heartbeat(104.0)  # 1
    calc.update_on_heartbeat(106.5)  # 2.5
    calc.update_on_heartbeat(107.0)  # 0.5
    assert calc.initial_max_time == pytest.approx(3.0)
    assert calc.subsequent_max_time == pytest.approx(2.5)
    hb = calc.get_hb_timeouts()
    assert hb.initial == pytest.approx(6.0)
    assert hb.subsequent == pytest.approx(5.0)
    assert hb.were_calculated is True


def test_not_enough_data_is_an_error() -> None:
    with pytest.raises(TimeoutsCalcError, match="Not enough data"):
        TimeoutsCalc().get_hb_timeouts()
    with pytest.raises(TimeoutsCalcError, match="Not enough data"):
        TimeoutsCalc(sections=["a"]).get_section_timeouts()


def test_merge_grows_at_once_and_shrinks_by_half_never_below_observed() -> None:
    calc = TimeoutsCalc(start_time=0.0, safety_factor=2.0)
    calc.update_on_heartbeat(1.0)
    calc.update_on_heartbeat(3.0)  # subsequent max 2 -> new timeout 4
    grown = calc.get_hb_timeouts(HeartbeatTimeouts(1.0, 1.0, were_calculated=True))
    assert grown.subsequent == pytest.approx(4.0)  # not the EMA 2.5, which is below 2*observed
    shrunk = calc.get_hb_timeouts(HeartbeatTimeouts(20.0, 20.0, were_calculated=True))
    assert shrunk.subsequent == pytest.approx(12.0)
    configured = calc.get_hb_timeouts(HeartbeatTimeouts(20.0, 20.0, were_calculated=False))
    assert configured.subsequent == pytest.approx(4.0)  # configured values are not merged


def test_nested_and_overlapping_sections() -> None:
    calc = TimeoutsCalc(sections=["a", "b", "c"], start_time=0.0, safety_factor=1.0)
    calc.update_on_section_event("a", OPEN, 2.0)  # out-of-section 2
    calc.update_on_section_event("b", OPEN, 3.0)
    calc.update_on_section_event("a", CLOSE, 4.0)  # overlapping: a closes inside b
    assert set(calc.open_sections) == {"b"}
    calc.update_on_section_event("b", CLOSE, 9.0)
    calc.update_on_section_event("c", OPEN, 10.0)  # out-of-section 1
    calc.update_on_section_event(None, CLOSE_ALL, 10.5)
    assert calc.is_out_of_section
    assert calc.section_to_max_time == pytest.approx({"a": 2.0, "b": 6.0, "c": 0.5})
    assert calc.out_of_section_max_time == pytest.approx(2.0)
    calc.maybe_bump_oos_time(14.0)
    assert calc.out_of_section_max_time == pytest.approx(3.5)


def test_bad_section_events() -> None:
    calc = TimeoutsCalc(sections=["a"])
    with pytest.raises(TimeoutsCalcError, match="Unknown section 'x'"):
        calc.update_on_section_event("x", OPEN)
    with pytest.raises(TimeoutsCalcError, match="not open"):
        calc.update_on_section_event("a", CLOSE)
    calc.update_on_section_event("a", OPEN)
    with pytest.raises(TimeoutsCalcError, match="already open"):
        calc.update_on_section_event("a", OPEN)


def test_section_timeouts_selection_and_merge() -> None:
    calc = TimeoutsCalc(sections=["a", "b"], start_time=0.0, safety_factor=2.0)
    calc.update_on_section_event("a", OPEN, 1.0)
    calc.update_on_section_event("a", CLOSE, 2.0)
    assert not calc.can_get_section_timeouts()  # b never observed
    assert calc.can_get_section_timeouts(["a"])
    current = SectionTimeouts(section={"a": 10.0, "b": 7.0}, out_of_section=30.0)
    got = calc.get_section_timeouts(["a"], calc_out_of_section=True, current=current)
    assert got.section == pytest.approx({"a": 2.0, "b": 7.0})
    assert got.out_of_section == pytest.approx(2.0)
    assert got.calculated_sections == {"a"}
    assert got.is_out_of_section_calculated
    assert not got.were_calculated
    again = calc.get_section_timeouts(
        ["a"],
        current=SectionTimeouts(
            section={"a": 10.0, "b": 7.0},
            out_of_section=30.0,
            calculated_sections={"a"},
            is_out_of_section_calculated=True,
        ),
    )
    assert again.section["a"] == pytest.approx(6.0)  # shrinks halfway from 10 towards 2
    assert again.out_of_section == pytest.approx(16.0)
    with pytest.raises(TimeoutsCalcError, match="Unknown sections"):
        calc.get_section_timeouts(["zzz"])


def test_safety_factor_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="safety_factor"):
        TimeoutsCalc(safety_factor=0.5)


def test_synchronize_without_process_group_is_an_error() -> None:
    with pytest.raises(TimeoutsCalcError, match="process group"):
        TimeoutsCalc().synchronize_all()


def test_min_timeout_floors_every_calculated_timeout() -> None:
    calc = TimeoutsCalc(sections=["a"], start_time=0.0, safety_factor=2.0, min_timeout=30.0)
    calc.update_on_heartbeat(0.05)
    calc.update_on_heartbeat(0.1)
    calc.update_on_section_event("a", OPEN, 1.0)
    calc.update_on_section_event("a", CLOSE, 100.0)
    hb = calc.get_hb_timeouts()
    assert (hb.initial, hb.subsequent) == (30.0, 30.0)
    sec = calc.get_section_timeouts()
    assert sec.section["a"] == pytest.approx(198.0)  # above the floor: unchanged
    assert sec.out_of_section == 30.0


def test_the_floor_says_once_that_it_raised_a_timeout(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from nvrx.ft import timeouts_calc

    monkeypatch.setattr(timeouts_calc, "_floor_logged", False)
    calc = TimeoutsCalc(start_time=0.0, safety_factor=5.0, min_timeout=30.0)
    calc.update_on_heartbeat(0.5)
    calc.update_on_heartbeat(1.0)
    with caplog.at_level(logging.INFO, logger="nvrx.ft.timeouts_calc"):
        calc.get_hb_timeouts()
        calc.get_hb_timeouts()
    (record,) = caplog.records
    assert "min_calculated_timeout" in record.message
    assert "2.500 s" in record.message


def test_calculated_timeouts_are_capped_at_the_maximum_duration() -> None:
    from nvrx.ft import MAX_DURATION_S

    calc = TimeoutsCalc(start_time=0.0, safety_factor=1000.0)
    calc.update_on_heartbeat(10 * 24 * 3600.0)
    calc.update_on_heartbeat(20 * 24 * 3600.0)
    hb = calc.get_hb_timeouts()
    assert hb.initial == MAX_DURATION_S
    assert hb.subsequent == MAX_DURATION_S
