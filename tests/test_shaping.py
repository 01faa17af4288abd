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


def test_handles_as_the_kernel_holds_them():
    from fabric.shaping import handle_int
    assert handle_int("13:") == 0x130000 and handle_int("1:fe") == 0x100FE
    assert handle_int("1:10") == 0x10010


@pytest.mark.root
def test_lossless_layout_and_set_rate_keep_each_class_share(fabric):
    """The control class (PFC frames) is served first (HTB prio 0, data prio 1) and keeps
    1 % of the link, the data classes half each, when a lane failure lowers the rate."""
    from fabric.lossless import install
    from fabric.shaping import set_rate
    from topologies import full_mesh
    fab = fabric(full_mesh(nodes=2))
    install(fab)
    with fab.ipr("cpu0") as ipr:
        (index,) = ipr.link_lookup(ifname=fab.plan.port("cpu0", "cpu1").ifname)
        set_rate(ipr, index, 75.0)
        parms = {c["handle"]: c.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
                 for c in ipr.get_classes(index=index)}
        kinds = {q["handle"]: q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=index)}
    link = mbps_to_bytes_per_s(75.0)
    assert parms[0x10001]["rate"] == parms[0x10001]["ceil"] == link
    for data in (0x10010, 0x10013):
        assert (parms[data]["rate"], parms[data]["ceil"], parms[data]["prio"]) == \
            (link // 2, link, 1)
    control = parms[0x100FE]
    assert (control["rate"], control["ceil"], control["prio"]) == (link // 100, link, 0)
    assert kinds[0xFE0000] == "pfifo" and kinds[0x130000] == "tbf"
