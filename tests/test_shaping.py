"""HTB parameters in explicit units (no root): quantum and burst fit rate and MTU."""

from __future__ import annotations

import pytest

from fabric.shaping import HTB_QUANTUM_MAX, htb_params, mbps_to_bytes_per_s


def test_units():
    assert mbps_to_bytes_per_s(100) == 12_500_000
    assert mbps_to_bytes_per_s(0.008) == 1000


@pytest.mark.parametrize("rate_mbps", [1, 10, 100, 400, 1800, 10_000])
def test_quantum_and_burst_fit(rate_mbps):
    p = htb_params(rate_mbps, mtu=9000)
    assert 9014 <= p.quantum_bytes <= HTB_QUANTUM_MAX   # no kernel "quantum is big/small"
    assert p.burst_bytes >= 2 * 9014                    # a jumbo frame always fits
    assert p.rate_bytes_per_s == mbps_to_bytes_per_s(rate_mbps)


def test_bad_rate():
    with pytest.raises(ValueError, match="rate_mbps"):
        htb_params(0)
