"""topologies.units: the one module that converts, checked against hand-computed values."""

import pytest

from topologies import units


def test_rates_and_wire_times():
    assert units.mbps_to_bytes_per_s(100) == 12_500_000
    assert units.bytes_per_s_to_mbps(12_500_000) == pytest.approx(100)
    assert units.ns_per_byte(100) == pytest.approx(80)            # 8 bits at 100 Mbit/s
    assert units.transfer_s(12_500_000, 100) == pytest.approx(1.0)
    assert units.mbps(1_250_000, 0.1) == pytest.approx(100)
    assert units.mbps(1, 0) == 0.0
    # one PFC quantum (512 bit times) at 100 Mbit/s: 5.12 us
    assert units.bits_time_s(512, 100) == pytest.approx(5.12e-6)


def test_scale_factor_both_ways():
    assert units.real_mbps(100, 4000) == 400_000                  # 400 Gb/s
    assert units.rate_text(units.real_mbps(100, 4000)) == "400 Gb/s"
    assert units.rate_text(units.real_mbps(1800, 4000)) == "7.2 Tb/s"
    assert units.rate_text(50) == "50 Mbit/s"
    assert units.real_s(4.0, 4000) == pytest.approx(1e-3)
