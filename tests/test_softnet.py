"""The kernel's receive counters (testbed.softnet): parsed, differenced, never guessed."""

from __future__ import annotations

from pathlib import Path

from testbed import softnet

# Two CPUs, as this kernel prints them (13 or more hexadecimal columns per CPU).
BEFORE = ("015657fe 00000000 000000db 00000000 00000000 00000000 00000000 00000000 "
          "00000000 00000000 00000000 00000000 00000000\n"
          "018f56e9 00000002 000000ed 00000000 00000000 00000000 00000000 00000000 "
          "00000000 00000000 00000000 00000000 00000001\n")


def test_columns_are_summed_over_the_cpus():
    got = softnet.parse(BEFORE)
    assert got == softnet.Softnet(0x015657FE + 0x018F56E9, 2, 0xDB + 0xED)


def test_the_difference_counts_backlog_drops_and_squeezes_per_thousand_frames():
    before = softnet.parse(BEFORE)
    after = softnet.Softnet(before.processed + 40_000, before.dropped + 3,
                            before.squeezed + 10)
    assert softnet.delta(before, after) == {"processed": 40_000, "backlog_drops": 3,
                                            "squeezes": 10, "squeezes_per_1k_frames": 0.25}
    idle = softnet.delta(before, before)
    assert idle["squeezes_per_1k_frames"] == 0.0 and idle["processed"] == 0


def test_unknown_rather_than_wrong():
    before = softnet.parse(BEFORE)
    wrapped = softnet.Softnet(before.processed - 5, before.dropped, before.squeezed)
    assert softnet.delta(before, wrapped) is None          # a 32-bit counter wrapped
    assert softnet.delta(None, before) is None
    assert softnet.read(Path("/nonexistent/softnet_stat")) is None


def test_this_kernel_shows_them():
    now = softnet.read()
    assert now is not None and now.processed > 0
